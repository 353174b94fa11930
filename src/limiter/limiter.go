package limiter

import (
	"context"
	"fmt"
	"time"
)

// Algorithm selects how a Rule counts hits.
type Algorithm uint8

const (
	// FixedWindow counts hits in windows aligned to multiples of the period
	// since the Unix epoch; the count starts again at each boundary.
	FixedWindow Algorithm = iota
	// SlidingWindow weighs the previous window's count by how much of it still
	// overlaps a window ending now, so bursts at a boundary cannot double the
	// limit.
	SlidingWindow
	// TokenBucket refills continuously at Limit per Period up to Burst tokens,
	// implemented as GCRA: one timestamp per key.
	TokenBucket
	// SlidingLog keeps the time of every counted hit: never more than Limit
	// hits in any span of one Period, exactly. It costs memory per hit, so
	// configs bound its Limit (MaxLogLimit).
	SlidingLog
	// Concurrency limits work in flight, not a rate: Limit is a number of
	// slots, a hit takes Cost of them and a refund gives them back, and a
	// slot not given back within Period is freed by itself (a release
	// Envoy never sent does not hold it for ever). A refund gives back the
	// oldest slots first, so a slot whose release was lost is the first to
	// go. Its state is a sliding log of the takes, bounded like one.
	Concurrency
)

// MaxLogLimit is the largest Limit a SlidingLog (or Concurrency) rule may carry: its state
// holds up to one entry per counted request (16 bytes each), and a
// decision on a full log costs Redis time that grows with its length
// (BenchmarkAccuracy; figures in docs/performance.md): ten times this was
// too long to hold a shared Redis per decision.
const MaxLogLimit = 1_000

var algorithmNames = [...]string{"fixed_window", "sliding_window", "token_bucket", "sliding_log", "concurrency"}

// String returns the algorithm's configuration name.
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", a)
}

// ParseAlgorithm maps a configuration name to an Algorithm. The empty string
// means FixedWindow, the default.
func ParseAlgorithm(s string) (Algorithm, error) {
	if s == "" {
		return FixedWindow, nil
	}
	for i, n := range algorithmNames {
		if n == s {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want fixed_window, sliding_window, token_bucket, sliding_log or concurrency)", s)
}

// Rule is one limit as a store applies it. The zero Rule rejects everything
// (a Limit of 0 always rejects).
type Rule struct {
	Algorithm Algorithm
	// Limit is the number of hits allowed per Period.
	Limit uint64
	// Period is the window length, for TokenBucket the time in which Limit
	// tokens refill, or for Concurrency the longest a slot is held. It is always a whole number of seconds.
	Period time.Duration
	// Burst is the TokenBucket capacity; 0 means Limit. Other algorithms
	// ignore it.
	Burst uint64
	// Overdraft counts hits that do not fit instead of dropping them: they
	// are answered rejected, the count may pass the limit (a token bucket
	// goes into debt), and every hit, a check of cost 0 included, is
	// rejected until the window, the refill or refunds bring usage under
	// the limit. For usage reported after the fact (tokens, bytes).
	Overdraft bool
	// CountRejected is envoyproxy/ratelimit's counting, for FixedWindow
	// rules only: every hit is counted, allowed or not, and a hit is
	// rejected when the count after it passes Limit. A check (cost 0) is
	// then allowed at exactly the limit and rejected past it, so usage
	// reported after the response (check with cost 0, report the usage)
	// holds a tenant back once its reports pass the limit. It differs from
	// Overdraft only at exactly the limit, where Overdraft rejects a check;
	// a rule carries one or the other.
	CountRejected bool
	// Lease, when set, lets a store that shares its counts between
	// replicas (Redis) take the budget of a hot key in slices and admit
	// from a slice locally; it names the rule in the lease's metrics.
	// Only FixedWindow and SlidingWindow rules without Overdraft may carry
	// it (LeaseSupported); the embedded store, exact and local anyway,
	// ignores it.
	Lease string
	// Calendar, when set on a FixedWindow or SlidingWindow rule, aligns
	// its windows to a zone's calendar (days, ISO weeks, months, years)
	// instead of to multiples of Period since the epoch; Period is then
	// the unit's nominal length. Leases and RLQS windows ignore it, and
	// configs refuse it there.
	Calendar *Calendar
}

// LeaseSupported reports whether a slice of a's budget, counted when it
// is taken and spent later on one replica, can never let a window admit
// past its limit: the hits of a slice are counted in the window in which
// they are admitted, before the window's end, which holds for window
// counts. A token bucket would have refilled under the slice's hits by
// the time they are spent, and a sliding log keeps each hit's own time.
func LeaseSupported(a Algorithm) bool { return a == FixedWindow || a == SlidingWindow }

// keepsLog reports whether a's state is a log of counted hits, one entry
// per call that counted (SlidingLog and Concurrency), rather than a few
// numbers.
func (a Algorithm) keepsLog() bool { return a == SlidingLog || a == Concurrency }

// Hit asks a store to count Cost hits against Key under Rule.
type Hit struct {
	// Key identifies the counter. It is already encoded by the caller and is
	// unique per descriptor value and rule identity.
	Key  string
	Rule Rule
	// Cost is the number of hits to count; 0 only reports.
	Cost uint64
	// Advisory marks a hit whose rejection does not reject the request
	// (shadow mode, quota mode). Under Batch.AllOrNothing an advisory
	// rejection does not stop the other hits from being counted.
	Advisory bool
	// Refund gives Cost hits back instead of counting them
	// (is_negative_hits): never past an empty counter or a full bucket, and
	// nothing on a key with no state. A refund is always allowed and
	// reports what is left after it; a refund of 0 is a plain check.
	Refund bool
}

// Blocks reports whether h's rejection, under Batch.AllOrNothing, stops
// every hit of the batch from being counted. Advisory hits never block.
// Overdraft and CountRejected hits block the others but are counted
// themselves (see Batch.AllOrNothing).
func (h *Hit) Blocks() bool { return !h.Advisory && !h.Rule.Overdraft && !h.Rule.CountRejected }

// Reports is whether h, with outcome out, records usage that happened (an
// overdraft hit, a refund, or a CountRejected hit that was rejected), which
// such a rejection alone does not cancel. A CountRejected hit that was
// allowed is not written then, as envoyproxy/ratelimit counts only the
// hits over their limit when STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT holds
// a request back.
func (h *Hit) Reports(out Outcome) bool {
	return h.Rule.Overdraft || h.Refund || h.Rule.CountRejected && !out.Allowed
}

// Commit says which of a batch's evaluated hits are written.
type Commit uint8

const (
	// CommitAll writes every hit whose evaluation asks for it.
	CommitAll Commit = iota
	// CommitReports writes only overdraft hits, refunds and rejected
	// CountRejected hits: such a hit was rejected, nothing else that
	// blocks was (AllOrNothing).
	CommitReports
	// CommitNone writes nothing: a dry run, or a blocking rejection under
	// AllOrNothing.
	CommitNone
)

// Decide returns what a batch writes, given its hits and their outcomes
// as evaluated. It is the one rule both stores apply, in Go and in Lua.
func Decide(b Batch, outs []Outcome) Commit {
	if b.DryRun {
		return CommitNone
	}
	if !b.AllOrNothing {
		return CommitAll
	}
	commit := CommitAll
	for i := range b.Hits {
		if outs[i].Allowed || b.Hits[i].Advisory {
			continue
		}
		if b.Hits[i].Blocks() {
			return CommitNone
		}
		commit = CommitReports
	}
	return commit
}

// Writes reports whether, under c, hit h (whose evaluation asked to be
// written, with outcome out) is written.
func (c Commit) Writes(h *Hit, out Outcome) bool {
	return c == CommitAll || c == CommitReports && h.Reports(out)
}

// Outcome is a store's answer for one Hit.
type Outcome struct {
	Allowed bool
	// Remaining is how many more unit-cost hits would be allowed right now.
	Remaining uint64
	// ResetAfter is the time until the counter is back to its empty state:
	// the end of the window (FixedWindow), until every counted hit has aged
	// out (SlidingWindow), or until the bucket is full (TokenBucket); for
	// SlidingLog, until the oldest counted hit leaves the window; for
	// Concurrency, until the oldest held slot is freed by its hold bound.
	ResetAfter time.Duration
	// RetryAfter is, for a rejected hit, the earliest time after which the
	// same hit could be allowed if nothing else arrives; 0 when allowed.
	RetryAfter time.Duration
	// Cached is set when a store's local over-limit cache answered the hit
	// without its backend.
	Cached bool
	// Excess is, for a rejected FixedWindow hit that was counted anyway
	// (CountRejected, Overdraft), how far the count went past the limit
	// with it: the count before it was Limit+Excess-cost. Metrics split
	// such a hit into near_limit and over_limit with it, as
	// envoyproxy/ratelimit does. 0 for every other hit.
	Excess uint64
}

// Batch is one request's worth of hits, applied at one instant.
type Batch struct {
	// Now is the instant to count at. The zero value means "the store's own
	// clock" (for the Redis store: Redis's TIME, so replicas agree).
	Now  time.Time
	Hits []Hit
	// AllOrNothing, when set, counts nothing at all if any non-advisory hit
	// is rejected (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT). Without it each
	// allowed hit is counted and each rejected one is not. Overdraft wins
	// for its own hits: if only overdraft hits are rejected, they and the
	// refunds are counted and nothing else is; a rejection of any other
	// non-advisory hit counts nothing, overdraft hits included.
	// CountRejected hits act as overdraft hits here, except that only the
	// rejected ones are counted (as envoyproxy/ratelimit does). Refunds are
	// part of the batch: a batch that counts nothing gives nothing back.
	AllOrNothing bool
	// DryRun counts nothing: each hit is decided as if counted, and an
	// allowed hit reports what a cost of 0 sees (as AllOrNothing reports
	// when it rejects). Split uses it to check both of its stores first.
	DryRun bool
}

// Store counts hits. Implementations are safe for concurrent use.
type Store interface {
	// Apply counts each hit as of b.Now and returns one Outcome per Hit, in
	// order. A rejected hit consumes nothing unless its rule counts
	// rejections (Rule.CountRejected, the reference's counting and the
	// service's default; Rule.Overdraft): then it is counted all the
	// same, and its Outcome.Excess says how far past the limit.
	Apply(ctx context.Context, b Batch) ([]Outcome, error)
}

// Step is a step of CheckThenCount.
type Step uint8

// The steps of CheckThenCount.
const (
	StepCheck   Step = iota // apply the whole batch as a dry run
	StepReports             // count only its overdraft hits, refunds and rejected CountRejected hits; the others keep their checked outcomes
	StepAll                 // apply the whole batch
)

// CheckThenCount applies an all-or-nothing batch over parts that share no
// atomic step (two stores, Redis Cluster slots): it checks the whole batch
// first, then, by Decide, counts nothing, only the reports, or everything.
// A concurrent request can slip in between check and count; within one
// part each step is still atomic. apply runs one step over every part; for
// StepReports and StepAll it gets the checked outcomes.
func CheckThenCount(b Batch, apply func(step Step, checked []Outcome) ([]Outcome, error)) ([]Outcome, error) {
	outs, err := apply(StepCheck, nil)
	if err != nil {
		return nil, err
	}
	switch Decide(b, outs) {
	case CommitNone:
		return outs, nil
	case CommitReports:
		return apply(StepReports, outs)
	}
	return apply(StepAll, outs)
}
