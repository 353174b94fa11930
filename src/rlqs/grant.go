package rlqs

import (
	"math"
	"time"

	"github.com/openrls/ratelimit/src/rlqs/plan"
)

// What a bucket is granted each round: jobFor decides, limitedJob builds a
// token bucket's grant with each member's ledger, shrink fits it to what the
// store has room for, holdBack answers a bucket that gets nothing.

// shrink returns the job of the largest grant below j's that fits what the
// check found left in each window it fell short in, or the bucket's job
// without a share.
func (g *state) shrink(j *job, now time.Time) *job {
	g.stats.shortfalls.Inc()
	fits := func(q uint32) *job {
		c := g.sizedJob(j.b, now, q, j.fillSecs, false)
		for i, t := range c.trials {
			for w, left := range j.left[i] {
				if t.need(w) > left {
					return nil
				}
			}
		}
		return c
	}
	lo, hi := int64(-1), int64(j.perFill) // fits(lo) or lo == -1; !fits(hi)
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if fits(uint32(mid)) != nil {
			lo = mid
		} else {
			hi = mid
		}
	}
	if lo >= 0 {
		if c := fits(uint32(lo)); c != nil {
			return c
		}
	}
	if hb := g.holdBack(j.b, now); hb != nil {
		return hb
	}
	return &job{b: j.b} // nothing to send: what is in force runs out
}

// jobFor says what bucket b is sent this round, or nil for nothing.
func (g *state) jobFor(b *bucket, now time.Time) *job {
	if b.kind != kindLimited {
		if b.sentKind == b.kind && !b.lapsed && now.Sub(b.sent) < g.o.TTL/2 {
			return nil
		}
		return &job{b: b, kind: b.kind}
	}
	rate, f, holds := math.Inf(1), int64(0), len(b.members) > 0
	for _, m := range b.members {
		holds = holds && m.holds
		if m.target < rate {
			rate, f = m.target, int64(m.p.rule.Period/time.Second)
		}
	}
	if !holds && b.sentKind == kindLimited && !b.lapsed {
		// Its share went to another (a crowded pool rotates them), or it
		// reported no requests: DENY_ALL now hands its room over a
		// delivery bound later, where the token bucket it holds would
		// keep it reserved to its horizon. An idle bucket loses little by
		// it: a request it then denies shows in its next report, as one
		// would once the token bucket lapsed (holdBack), 2 s later with
		// the default settings. Run on, an Envoy whose demand had moved
		// to another kept its room from the other 3 s past its report.
		return &job{b: b, kind: kindDeny}
	}
	if !holds {
		return g.holdBack(b, now)
	}
	// A target under a token per period is a grant of 0: the 0.9 every
	// grant carries (plan.ExtraPerPeriod).
	q := math.Floor(rate*float64(f) + 1e-9)
	return g.limitedJob(b, now, uint32(min(q, math.MaxUint32)), f)
}

// limitedJob is the job of granting b q tokens every f seconds: each
// member's ledger with the grant in it, and what the store must add. Its
// capacity may grow (plan.CapacityFor); shrink's smaller grants keep it.
func (g *state) limitedJob(b *bucket, now time.Time, q uint32, f int64) *job {
	return g.sizedJob(b, now, q, f, true)
}

// sizedJob is limitedJob, with a capacity that may grow or not.
func (g *state) sizedJob(b *bucket, now time.Time, q uint32, f int64, mayGrow bool) *job {
	lapsed := b.sentKind != kindLimited || b.lapsed || !now.Add(g.o.Delivery).Before(b.sent.Add(g.o.TTL))
	j := &job{b: b, kind: kindLimited, perFill: q, fillSecs: f, capacity: plan.CapacityFor(b.sentCap, q, startCapacity(b, f), lapsed, mayGrow)}
	_, _, r := plan.TokenBucket(j.perFill, f)
	for i, m := range b.members {
		m.l.advance(now)
		t := m.l.clone()
		grows := t.grant(j.capacity, now, now.Add(g.o.TTL+g.o.Delivery))
		reset := lapsed || grows
		switch {
		case reset && t.began.IsZero():
			// A first assignment starts full once, in whichever window it
			// lands: the window it is sent in, or the next, whose kept
			// tokens (began is before it) already count it.
			t.reset(now, now)
		case reset:
			t.reset(now, now.Add(g.o.Delivery))
		}
		t.raise(now, now.Add(g.o.TTL+g.o.Delivery), r)
		t.note(seg{now, now.Add(g.o.TTL + g.o.Delivery), r}, j.capacity)
		j.members, j.trials = append(j.members, m), append(j.trials, t)
		t.shortfall(now, func(w int64, n uint64) {
			at := maxTime(t.start(w), now)
			j.asks = append(j.asks, &ask{job: j, trial: i, member: m, rule: m.p.rule, window: w, tokens: n, at: at, key: m.p.key})
		})
	}
	return j
}

// holdBack is the job of a limited bucket with no share this round: a token
// bucket in force runs on (what the store holds covers it) while the next
// round could still replace it before it ends; one that could not is
// replaced by DENY_ALL now, and a bucket with none is denied explicitly.
// Otherwise the token bucket would end at its TTL and, with Envoy's
// default settings (no expired-assignment fallback), the Envoy would allow
// everything until the DENY_ALL of a later round arrived: requests nothing
// reserved.
func (g *state) holdBack(b *bucket, now time.Time) *job {
	// The next round's action arrives by now + Push + Delivery; the token
	// bucket ends no earlier than its sending plus its TTL.
	lastsPastNext := now.Add(g.o.Push + g.o.Delivery).Before(b.sent.Add(g.o.TTL))
	inForce := b.sentKind == kindLimited && !b.lapsed && lastsPastNext
	if inForce || b.sentKind == kindDeny && !b.lapsed && now.Sub(b.sent) < g.o.TTL/2 {
		return nil
	}
	return &job{b: b, kind: kindDeny}
}
