package rlqs

import (
	"cmp"
	"context"
	"runtime"
	"slices"
	"strings"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/openrls/ratelimit/src/limiter"
)

// job is one bucket's part of a round.
type job struct {
	b        *bucket
	kind     kind // what to send; kindNone sends nothing
	abandon  bool
	q        uint32 // tokens per fill interval
	f        int64  // the fill interval, seconds
	capacity uint64
	// members are the bucket's members as planned, trials their ledgers
	// with the grant in (by index).
	members []*member
	trials  []*ledger
	asks    []*ask
	// Set by reserve.
	refused bool
	failed  bool
	// left is, by member and window, what the check found the store could
	// still hold for this bucket where the grant fell short.
	left     []map[int64]uint64
	credited bool
}

// ask is a job's request to the store for one member and window. It
// holds what it needs of the member as the plan saw it: the round reads
// it after releasing the service's lock, when a closing stream may have
// emptied the bucket's members (leave).
type ask struct {
	j    *job
	m    int     // index into j.trials
	mb   *member // the member, which keeps its ledger once it has left
	rule limiter.Rule
	w    int64
	n    uint64
	at   time.Time
	key  string
	ok   bool
}

// round renews and refills: every bucket when only is nil, else only
// those (a stream's new buckets, answered as soon as they are reported).
func (s *Service) round(ctx context.Context, only []*bucket) {
	s.grant.Lock()
	defer s.grant.Unlock()
	now := s.o.Clock()
	if only == nil {
		s.exchangeDemand(ctx, now)
	}
	var jobs []*job
	s.locked(func() { jobs = s.plan(now, only) })
	// Count at once: most grants fit, and checking each first would ask
	// the store twice for every one. A grant that does not fit in full is
	// given back and cut to what the store can hold (counting a part of
	// it would hold tokens nobody is sent); only those are asked again.
	s.reserve(ctx, jobs)
	var short []*job
	for _, j := range jobs {
		if j.failed && !j.refused {
			short = append(short, j)
		}
	}
	if len(short) > 0 {
		s.giveBack(ctx, short)
		var again []*job
		s.locked(func() {
			for i, j := range jobs {
				if j.failed && !j.refused && !j.b.gone {
					jobs[i] = s.cut(j, now)
					again = append(again, jobs[i])
				}
			}
		})
		s.reserve(ctx, again)
	}
	s.locked(func() { s.commit(now, jobs) })
}

// locked runs f with the service's lock held, released however f ends (a
// panic recovered by safeRound must not leave it held).
func (s *Service) locked(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
}

// credit records what the store granted for a job's asks: in its trial
// ledgers, and, when the job did not succeed, in the buckets' own (the
// store holds it either way).
func (s *Service) credit(j *job) {
	if j.credited {
		return
	}
	j.credited = true
	for _, a := range j.asks {
		if a.ok {
			j.trials[a.m].wins.at(a.w).held += a.n
			if j.refused || j.failed {
				a.mb.l.wins.at(a.w).held += a.n
			}
		}
	}
}

// plan decides what each bucket should get and what the store must hold
// for it.
func (s *Service) plan(now time.Time, only []*bucket) []*job {
	cfg := s.o.Configs.Load()
	buckets := only
	if only == nil {
		for st := range s.streams {
			for _, b := range st.buckets {
				buckets = append(buckets, b)
			}
			for key, at := range st.abandoned {
				if now.Sub(at) >= abandonedFor {
					delete(st.abandoned, key)
				}
			}
		}
	}
	var jobs []*job
	live := buckets[:0:0]
	for _, b := range buckets {
		if b.gone {
			continue
		}
		if only == nil && now.Sub(b.lastTraffic) >= s.o.Idle {
			if len(b.s.abandoned) < s.o.MaxBuckets {
				b.s.abandoned[bucketKey(b.values)] = now
			}
			s.drop(b)
			s.stats.abandoned.Inc()
			jobs = append(jobs, &job{b: b, abandon: true})
			continue
		}
		s.reclassify(b, cfg)
		live = append(live, b)
	}
	filled := map[*pool]bool{}
	for _, b := range live {
		for _, m := range b.members {
			if !filled[m.p] {
				filled[m.p] = true
				m.p.fill()
			}
		}
	}
	for _, b := range live {
		if j := s.jobFor(b, now); j != nil {
			jobs = append(jobs, j)
		}
	}
	return jobs
}

// reserve counts every job's asks in the store and notes what it
// refused and, where a grant fell short, what the store could still hold.
func (s *Service) reserve(ctx context.Context, jobs []*job) {
	s.inBatches(jobs, func(*ask) bool { return true }, func(at time.Time, asks []*ask) { s.reserveBatch(ctx, at, asks) })
}

// giveBack returns to the store what it counted for jobs that fell short.
func (s *Service) giveBack(ctx context.Context, jobs []*job) {
	s.inBatches(jobs, func(a *ask) bool { return a.ok }, func(at time.Time, asks []*ask) { s.giveBackBatch(ctx, at, asks) })
}

// inBatches calls do with the jobs' asks that pick chooses, one instant
// and about maxBatch asks at a time.
func (s *Service) inBatches(jobs []*job, pick func(*ask) bool, do func(at time.Time, asks []*ask)) {
	byAt := map[time.Time][]*ask{}
	for _, j := range jobs {
		for _, a := range j.asks {
			if pick(a) {
				byAt[a.at] = append(byAt[a.at], a)
			}
		}
	}
	for at, all := range byAt {
		for _, asks := range batches(all, maxBatch) {
			do(at, asks)
			// Let the ordinary calls waiting for a processor run between
			// batches: the scheduler would preempt this goroutine only
			// after 10 ms, and on two cores those calls would wait that
			// long behind a round (BenchmarkRLQSChurn).
			runtime.Gosched()
		}
	}
}

// maxBatch is about how many asks go to the store in one call. A round
// over thousands of buckets asks for thousands of keys; in one call they
// would hold the embedded store's locks, or Redis, for as long as they
// take, and every ordinary ShouldRateLimit call would wait behind them
// (BenchmarkRLQSChurn; its figures are in docs/rlqs.md).
const maxBatch = 128

// batches cuts asks into batches of about max, keeping the asks of one
// store key together and in order: a key's later asks see its earlier
// ones within a batch, and asks of different keys are independent, so
// the batches decide as one call would. A stable sort by (key, window)
// groups them without a string or a map per key, which a round over
// thousands of buckets would otherwise allocate.
func batches(asks []*ask, max int) [][]*ask {
	if len(asks) <= max {
		return [][]*ask{asks}
	}
	sorted := slices.Clone(asks)
	slices.SortStableFunc(sorted, func(a, b *ask) int {
		if c := strings.Compare(a.key, b.key); c != 0 {
			return c
		}
		return cmp.Compare(a.w, b.w)
	})
	var out [][]*ask
	start := 0 // where the batch being cut starts
	for i := 0; i < len(sorted); {
		j := i + 1 // the end of the key's asks
		for j < len(sorted) && sorted[j].key == sorted[i].key && sorted[j].w == sorted[i].w {
			j++
		}
		if i > start && j-start > max {
			out, start = append(out, sorted[start:i]), i
		}
		i = j
	}
	return append(out, sorted[start:])
}

// reserveBatch counts one batch of asks in the store, at at.
func (s *Service) reserveBatch(ctx context.Context, at time.Time, asks []*ask) {
	hits := make([]limiter.Hit, len(asks))
	for i, a := range asks {
		hits[i] = limiter.Hit{Key: limiter.WindowKey(a.key, a.w), Rule: a.rule, Cost: a.n}
	}
	outs, err := s.o.Store.Apply(ctx, limiter.Batch{Now: at, Hits: hits})
	if err != nil {
		s.storeError(err)
		for _, a := range asks {
			a.j.refused = true
		}
		return
	}
	for i, a := range asks {
		if outs[i].Allowed {
			a.ok = true
			continue
		}
		j := a.j
		if j.left == nil {
			j.left = make([]map[int64]uint64, len(j.trials))
		}
		if j.left[a.m] == nil {
			j.left[a.m] = map[int64]uint64{}
		}
		j.left[a.m][a.w] = j.trials[a.m].wins.get(a.w).held + outs[i].Remaining
		j.failed = true
	}
}

// giveBackBatch returns one batch of counted asks to the store, at at.
// Whether a refund the store failed on was applied is unknown, so it is
// taken as applied either way: the bucket is not credited with tokens the
// store may no longer hold, at worst the store holds some that nobody is
// sent until their window ends. Its job sends nothing (refused), as when
// the store fails a count.
func (s *Service) giveBackBatch(ctx context.Context, at time.Time, asks []*ask) {
	hits := make([]limiter.Hit, len(asks))
	for i, a := range asks {
		hits[i] = limiter.Hit{Key: limiter.WindowKey(a.key, a.w), Rule: a.rule, Cost: a.n, Refund: true}
	}
	_, err := s.o.Store.Apply(ctx, limiter.Batch{Now: at, Hits: hits})
	if err != nil {
		s.storeError(err)
	}
	for _, a := range asks {
		a.ok = false
		if err != nil {
			a.j.refused = true
		}
	}
}

// commit records what the store now holds, settles each job and sends.
func (s *Service) commit(now time.Time, jobs []*job) {
	out := map[*stream]*rlqsv3.RateLimitQuotaResponse{}
	sent := map[*stream][]*bucket{}
	for _, j := range jobs {
		b := j.b
		s.credit(j)
		if b.gone && !j.abandon {
			continue
		}
		action := s.settle(j, now)
		if action == nil {
			continue
		}
		if out[b.s] == nil {
			out[b.s] = &rlqsv3.RateLimitQuotaResponse{}
		}
		out[b.s].BucketAction = append(out[b.s].BucketAction, action)
		sent[b.s] = append(sent[b.s], b)
	}
	for st, m := range out {
		select {
		case st.out <- m:
		default:
			// The Envoy reads slower than we renew: this message is lost,
			// so what it renewed may lapse before the next one.
			s.stats.dropped.Inc()
			for _, b := range sent[st] {
				b.lapsed = true
			}
		}
	}
}

// settle applies a job's outcome to its bucket and returns the action to
// send, or nil.
func (s *Service) settle(j *job, now time.Time) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	b := j.b
	if j.abandon {
		s.stats.assignments.WithLabelValues("abandon").Inc()
		return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: b.id,
			BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}}
	}
	switch {
	case j.kind == kindNone:
		return nil
	case j.refused:
		return nil // the store is away: what is in force lapses to the Envoy's fallback
	case j.failed:
		// Another replica counted between the check and the count.
		s.stats.shortfalls.Inc()
		if hb := s.holdBack(b, now); hb == nil {
			return nil
		}
		j.kind = kindDeny
	case j.kind == kindLimited:
		for i, m := range j.members {
			m.l = j.trials[i]
		}
		b.sentQ, b.sentF, b.sentCap = j.q, j.f, j.capacity
	}
	b.sent, b.sentKind, b.lapsed = now, j.kind, false
	s.stats.assignments.WithLabelValues(j.kind.String()).Inc()
	return s.action(b.id, j)
}

// action builds the assignment for a job.
func (s *Service) action(id *rlqsv3.BucketId, j *job) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	strategy := &typev3.RateLimitStrategy{}
	switch j.kind {
	case kindLimited:
		// A rate change rescales what the Envoy holds by new/old
		// capacity: 1 while the capacity stays, and a capacity that grows
		// is counted as a reset. fill_interval is the limit's period
		// (whole seconds: Envoy 1.40 divides by its whole seconds) and
		// tokens_per_fill is always set (1.40 reads an unset one as 0).
		strategy.Strategy = &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens: uint32(j.capacity), TokensPerFill: wrapperspb.UInt32(j.q), FillInterval: durationpb.New(time.Duration(j.f) * time.Second)}}
	case kindDeny:
		strategy.Strategy = &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}
	default:
		strategy.Strategy = &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}
	}
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(s.o.TTL), RateLimitStrategy: strategy}}}
}
