package rlqs

import (
	"context"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/rlqs/plan"
)

// job is one bucket's part of a round.
type job struct {
	b        *bucket
	kind     kind // what to send; kindNone sends nothing
	abandon  bool
	perFill  uint32 // tokens per fill interval
	fillSecs int64  // the fill interval, seconds
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
// holds what the store call needs as values the round owns (rule, key,
// window, tokens, instant): the round asks the store off the owner, while
// a closing stream may empty the bucket's members (leave). Its job (with
// the job's trial ledgers) is the round's own too; its member is read
// only on the owner.
type ask struct {
	job    *job
	trial  int     // index into j.trials
	member *member // the member, which keeps its ledger once it has left
	rule   limiter.Rule
	window int64
	tokens uint64
	at     time.Time
	key    string
	ok     bool
	back   bool // give it back (it was counted for a grant that fell short)
}

// round renews and refills: every bucket when only is nil, else only
// those (buckets due a round at once). It runs on Run's goroutine, one
// round at a time: a round reads ledgers, asks the store, then commits,
// and two rounds must not interleave on one. Its phases on the state run
// on the owner; the store is asked between them with the asks the owner
// made, which are values of the round's own (see ask), so every report,
// open and close goes on while the store works. A panic in a phase ends
// the round there: what it counted stays counted until its windows end,
// which errs toward admitting less.
func (s *Service) round(ctx context.Context, only []*bucket) error {
	now := s.o.Clock()
	if only == nil {
		s.exchangeDemand(ctx, now)
	}
	var jobs []*job
	var back []*ask
	if err := s.do("planning a grant round", func(g *state) {
		back = append(g.handOvers(now), g.lends(now)...)
		jobs = g.plan(now, only)
	}); err != nil {
		return err
	}
	// Count at once: most grants fit, and checking each first would ask
	// the store twice for every one. A grant that does not fit in full is
	// given back and shrunk to what the store can hold (counting a part of
	// it would hold tokens nobody is sent); only those are asked again.
	// What the grants handed over since the last round freed is given
	// back in the same calls, before the counts that may use it.
	s.reserve(ctx, back, jobs)
	var short []*job
	for _, j := range jobs {
		if j.failed && !j.refused {
			short = append(short, j)
		}
	}
	if len(short) > 0 {
		var again []*job
		if err := s.do("shrinking the grants that fell short", func(g *state) {
			for i, j := range jobs {
				if j.failed && !j.refused && !j.b.gone {
					jobs[i] = g.shrink(j, now)
					again = append(again, jobs[i])
				}
			}
		}); err != nil {
			return err
		}
		s.recount(ctx, short, again)
	}
	return s.do("committing a grant round", func(g *state) { g.commit(now, jobs) })
}

// credit records what the store granted for a job's asks: in its trial
// ledgers, and, when the job did not succeed, in the buckets' own (the
// store holds it either way).
func (g *state) credit(j *job) {
	if j.credited {
		return
	}
	j.credited = true
	for _, a := range j.asks {
		if a.ok {
			j.trials[a.trial].wins.at(a.window).held += a.tokens
			if j.refused || j.failed {
				a.member.l.wins.at(a.window).held += a.tokens
			}
		}
	}
}

// plan decides what each bucket should get and what the store must hold
// for it.
func (g *state) plan(now time.Time, only []*bucket) []*job {
	cfg := g.o.Configs.Load()
	buckets := only
	if only == nil {
		for st := range g.streams {
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
		if only == nil && now.Sub(b.lastTraffic) >= g.o.Idle {
			if len(b.s.abandoned) < g.o.MaxBuckets {
				b.s.abandoned[bucketKey(b.values)] = now
			}
			g.drop(b)
			g.stats.abandoned.Inc()
			jobs = append(jobs, &job{b: b, abandon: true})
			continue
		}
		g.reclassify(b, cfg)
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
	if only != nil {
		live = append(live, lowered(live)...)
	}
	for _, b := range live {
		if j := g.jobFor(b, now); j != nil {
			jobs = append(jobs, j)
		}
	}
	return jobs
}

// lowered is the buckets beside those of a round at once (live) whose
// grant the round's fill lowered, at most maxLowered of them: sent now, a
// lower grant hands its room over to the new or fallen bucket a push
// sooner than the next round would. A raise still waits for the push (see
// report). The bound keeps a round at once in a pool of thousands from
// costing a job per member for every new bucket; those past it are sent
// by the push, as before.
func lowered(live []*bucket) []*bucket {
	in := map[*bucket]bool{}
	for _, b := range live {
		in[b] = true
	}
	var out []*bucket
	for _, b := range live {
		for _, m := range b.members {
			for o := range m.p.members {
				if len(out) == maxLowered {
					return out
				}
				if !in[o.b] && !o.b.gone && o.b.kind == kindLimited && (!o.holds || o.target*o.p.rule.Period.Seconds() < o.held()-1e-9) {
					in[o.b] = true
					out = append(out, o.b)
				}
			}
		}
	}
	return out
}

// commit records what the store now holds, settles each job and sends.
// A message's grants hand over once it has left (see deliver).
func (g *state) commit(now time.Time, jobs []*job) {
	out := map[*stream]*outgoing{}
	for _, j := range jobs {
		b := j.b
		g.credit(j)
		if b.gone && !j.abandon {
			continue
		}
		action := g.settle(j, now)
		if action == nil {
			continue
		}
		o := out[b.s]
		if o == nil {
			o = &outgoing{msg: &rlqsv3.RateLimitQuotaResponse{}, at: now}
			out[b.s] = o
		}
		o.msg.BucketAction = append(o.msg.BucketAction, action)
		o.buckets = append(o.buckets, b)
		o.grants = g.grantsOf(j, now, o.grants)
	}
	for st, o := range out {
		select {
		case st.out <- o:
		default:
			// The Envoy reads slower than we renew: this message is lost,
			// so what it renewed may lapse before the next one.
			g.stats.dropped.Inc()
			for _, b := range o.buckets {
				b.lapsed = true
			}
		}
	}
}

// grantsOf appends to hands the grants j sends that hand over once their
// message has left: a token bucket's (noted in its trial ledgers, now the
// members'), or a DENY_ALL's, noted here as a grant of nothing.
func (g *state) grantsOf(j *job, now time.Time, hands []grantRef) []grantRef {
	switch {
	case j.abandon:
	case j.kind == kindLimited:
		for _, m := range j.members {
			hands = append(hands, grantRef{m, m.l.nextID})
		}
	case j.kind == kindDeny:
		for _, m := range j.b.members {
			hands = append(hands, grantRef{m, m.l.note(seg{from: now, to: now}, 0)})
		}
	}
	return hands
}

// settle applies a job's outcome to its bucket and returns the action to
// send, or nil.
func (g *state) settle(j *job, now time.Time) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	b := j.b
	if j.abandon {
		g.stats.assignments.WithLabelValues("abandon").Inc()
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
		g.stats.shortfalls.Inc()
		if hb := g.holdBack(b, now); hb == nil {
			return nil
		}
		j.kind = kindDeny
	case j.kind == kindLimited:
		for i, m := range j.members {
			m.l = j.trials[i]
			m.served++
		}
		b.sentQ, b.sentF, b.sentCap = j.perFill, j.fillSecs, j.capacity
	}
	b.sent, b.sentKind, b.lapsed = now, j.kind, false
	g.stats.assignments.WithLabelValues(j.kind.String()).Inc()
	return g.action(b.id, j)
}

// action builds the assignment for a job.
func (g *state) action(id *rlqsv3.BucketId, j *job) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	strategy := &typev3.RateLimitStrategy{}
	switch j.kind {
	case kindLimited:
		// A rate change rescales what the Envoy holds by new/old
		// capacity: 1 while the capacity stays, and a capacity that grows
		// is counted as a reset. fill_interval is plan.FillPeriods of the
		// limit's periods, its nanoseconds naming the period (see
		// tokenBucket), and tokens_per_fill is always set (1.40 reads an
		// unset one as 0).
		perFill, interval, _ := plan.TokenBucket(j.perFill, j.fillSecs)
		strategy.Strategy = &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens: uint32(j.capacity), TokensPerFill: wrapperspb.UInt32(perFill), FillInterval: durationpb.New(interval)}}
	case kindDeny:
		strategy.Strategy = &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}
	default:
		strategy.Strategy = &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}
	}
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(g.o.TTL), RateLimitStrategy: strategy}}}
}

// maxLowered bounds the lowered grants a round at once sends (see
// lowered): a store batch's worth.
const maxLowered = maxBatch
