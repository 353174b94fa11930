package rlqs

import (
	"math"
	"time"
)

// What a bucket is granted each round: jobFor decides, limitedJob builds a
// token bucket's grant with each member's ledger, cut fits it to what the
// store has room for, holdBack answers a bucket that gets nothing.

// cut returns the job of the largest grant below j's that fits what the
// check found left in each window it fell short in, or the bucket's job
// without a share.
func (s *Service) cut(j *job, now time.Time) *job {
	s.stats.shortfalls.Inc()
	fits := func(q uint32) *job {
		c := s.sizedJob(j.b, now, q, j.f, false)
		for i, t := range c.trials {
			for w, left := range j.left[i] {
				if t.need(w) > left {
					return nil
				}
			}
		}
		return c
	}
	lo, hi := int64(-1), int64(j.q) // fits(lo) or lo == -1; !fits(hi)
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
	if hb := s.holdBack(j.b, now); hb != nil {
		return hb
	}
	return &job{b: j.b} // nothing to send: what is in force runs out
}

// jobFor says what bucket b is sent this round, or nil for nothing.
func (s *Service) jobFor(b *bucket, now time.Time) *job {
	if b.kind != kindLimited {
		if b.sentKind == b.kind && !b.lapsed && now.Sub(b.sent) < s.o.TTL/2 {
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
		return s.holdBack(b, now)
	}
	// A target under a token per period is a grant of 0: the 0.9 every
	// grant carries (see fillPeriods).
	q := math.Floor(rate*float64(f) + 1e-9)
	return s.limitedJob(b, now, uint32(min(q, math.MaxUint32)), f)
}

// limitedJob is the job of granting b q tokens every f seconds: each
// member's ledger with the grant in it, and what the store must add. Its
// capacity may grow (see capacityFor); cut's smaller grants keep it.
func (s *Service) limitedJob(b *bucket, now time.Time, q uint32, f int64) *job {
	return s.sizedJob(b, now, q, f, true)
}

// sizedJob is limitedJob, with a capacity that may grow or not.
func (s *Service) sizedJob(b *bucket, now time.Time, q uint32, f int64, mayGrow bool) *job {
	lapsed := b.sentKind != kindLimited || b.lapsed || !now.Add(s.o.Delivery).Before(b.sent.Add(s.o.TTL))
	j := &job{b: b, kind: kindLimited, q: q, f: f, capacity: capacityFor(b, q, f, lapsed, mayGrow)}
	_, _, r := tokenBucket(j.q, f)
	for i, m := range b.members {
		m.l.advance(now)
		t := m.l.clone()
		grows := t.grant(j.capacity, now, now.Add(s.o.TTL+s.o.Delivery))
		reset := lapsed || grows
		switch {
		case reset && t.began.IsZero():
			// A first assignment starts full once, in whichever window it
			// lands: the window it is sent in, or the next, whose kept
			// tokens (began is before it) already count it.
			t.reset(now, now)
		case reset:
			t.reset(now, now.Add(s.o.Delivery))
		}
		t.raise(now, now.Add(s.o.TTL+s.o.Delivery), r)
		t.note(seg{now, now.Add(s.o.TTL + s.o.Delivery), r}, j.capacity)
		j.members, j.trials = append(j.members, m), append(j.trials, t)
		t.shortfall(now, func(w int64, n uint64) {
			at := maxTime(t.start(w), now)
			j.asks = append(j.asks, &ask{j: j, m: i, mb: m, rule: m.p.rule, w: w, n: n, at: at, key: m.p.key})
		})
	}
	return j
}

// fillPeriods is how many limit periods a token bucket's fill interval
// spans: a grant of q tokens per period is sent as q×fillPeriods +
// fillPeriods−1 tokens every fillPeriods periods, q + 0.9 a period. It
// costs what q alone does: a window's need counts whole requests (see
// ledger.need), and a bucket refilled at q + 0.9 a period admits no more
// whole requests in a window than one refilled at q (capacity + q at
// most), but it is full again a tenth of a period sooner. Sent q alone, a
// bucket asking exactly its grant, paced, lost about every other request
// to a token a moment short of full (nine light Envoys of 1/s admitted 5
// a second), and one asking more used q a period, its window's capacity
// tokens idle: 3 equal Envoys used 80% of a limit that reserves 100%.
const fillPeriods = 10

// extraPerPeriod is what every grant refills beyond its tokens per period.
const extraPerPeriod = float64(fillPeriods-1) / fillPeriods

// tokenBucket is what a grant of q tokens per period of f seconds sends:
// tokens per fill, the fill interval, and the rate in tokens per second
// (see fillPeriods). A grant too large to carry the extra goes as it is.
//
// The fill interval's nanoseconds name the period (f of them). Envoy 1.40
// refills at tokens per fill over the interval's whole seconds, so they
// change no rate, but it takes a token bucket whose capacity, tokens per
// fill and nanoseconds equal those of the one it holds for that one, and
// keeps its limiter, old rate and all, under the new TTL. An Envoy keeps
// its assignments when it reconnects, to another replica or after a
// restart, and a reload may change a rule's period: a grant for another
// period, or from a build that sent whole seconds (nanoseconds 0), would
// otherwise be taken for the one in force, and renewing it would keep an
// old rate refilling that nothing reserves. (A client that reads the
// nanoseconds refills a billionth slower: never more than is held.)
func tokenBucket(q uint32, f int64) (perFill uint32, interval time.Duration, rate float64) {
	name := time.Duration(min(f, 999_999_999))
	if q > (math.MaxUint32-(fillPeriods-1))/fillPeriods {
		return q, time.Duration(f)*time.Second + name, float64(q) / float64(f)
	}
	perFill = q*fillPeriods + fillPeriods - 1
	return perFill, time.Duration(f*fillPeriods)*time.Second + name, float64(perFill) / float64(f*fillPeriods)
}

// capacityFor is the capacity of b's next grant of q tokens per period.
// A token bucket that starts full anyway (startsFull: a first one, or one
// after DENY_ALL or a lapse) takes capacity(q), or on the round's first
// try the capacity its demand calls for (startCapacity). Otherwise a
// capacity that grows costs a reset in its window (the Envoy rescales the
// tokens it holds), which a pool whose shares fill its limit cannot spare
// unless its fill sets the growth aside (see setAside): unplanned, such a
// grant was cut to fit, with a capacity of 1 again, round after round (3
// equal Envoys with Poisson arrivals held 7/1, 9/2 and 7/1 of 30/s, and a
// capacity of 1 loses the refills that come due while its token waits).
// So the capacity grows only where mayGrow (the round's first try; cut's
// smaller grants keep the capacity held), to what the grant or the demand
// calls for, and shrinks only below shrinkBelow tokens per period, so
// that it does not flap.
func capacityFor(b *bucket, q uint32, f int64, startsFull, mayGrow bool) uint64 {
	switch {
	case (startsFull || b.sentCap == 0) && mayGrow:
		return max(capacity(q), startCapacity(b, f))
	case startsFull || b.sentCap == 0:
		return capacity(q)
	case b.sentCap > plainCapacity && b.sentCap > max(capacity(q), startCapacity(b, f)):
		// A burst its pools no longer pay for (see planBursts).
		return max(capacity(q), startCapacity(b, f))
	case q < shrinkBelow:
		return 1
	case mayGrow:
		return max(b.sentCap, capacity(q), startCapacity(b, f))
	}
	return b.sentCap
}

// startCapacity is the capacity b's demand calls for on a period of f
// seconds: capacity of what it asks (all it can get while unmeasured).
func startCapacity(b *bucket, f int64) uint64 {
	return max(capacity(uint32(min(b.demand*float64(f), math.MaxUint32))), burstRoom(b))
}

// burstRoom is the capacity every pool of b pays for beyond what its
// grant calls for (see planBursts): the least of its members' bursts.
func burstRoom(b *bucket) uint64 {
	if len(b.members) == 0 {
		return 0
	}
	room := uint64(math.MaxUint64)
	for _, m := range b.members {
		room = min(room, m.burst)
	}
	return room
}

// shrinkBelow is the grant, in tokens per period, below which a capacity
// of 2 shrinks to 1: half of where capacity gives 2.
const shrinkBelow = 4

// holdBack is the job of a limited bucket with no share this round: a token
// bucket in force runs on (what the store holds covers it) while the next
// round could still replace it before it ends; one that could not is
// replaced by DENY_ALL now, and a bucket with none is denied explicitly.
// Otherwise the token bucket would end at its TTL and, with Envoy's
// default settings (no expired-assignment fallback), the Envoy would allow
// everything until the DENY_ALL of a later round arrived: requests nothing
// reserved.
func (s *Service) holdBack(b *bucket, now time.Time) *job {
	// The next round's action arrives by now + Push + Delivery; the token
	// bucket ends no earlier than its sending plus its TTL.
	lastsPastNext := now.Add(s.o.Push + s.o.Delivery).Before(b.sent.Add(s.o.TTL))
	inForce := b.sentKind == kindLimited && !b.lapsed && lastsPastNext
	if inForce || b.sentKind == kindDeny && !b.lapsed && now.Sub(b.sent) < s.o.TTL/2 {
		return nil
	}
	return &job{b: b, kind: kindDeny}
}
