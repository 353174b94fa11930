package rlqs

import (
	"math"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"

	"github.com/openrls/ratelimit/src/rlqs/plan"
)

// TestEnvoyTakesNoGrantForAnother: Envoy 1.40 takes a token bucket whose
// capacity, tokens_per_fill and fill interval nanoseconds equal those of
// the one it holds for that one, and keeps the old limiter (its rate
// included) under the new TTL. An Envoy keeps its assignments across a
// reconnect, so the one it holds may come from another replica, another
// build (whole seconds, tokens per period), or before a reload changed
// the period. Every grant this service sends is seen as the one in force
// only when it refills at the same rate.
func TestEnvoyTakesNoGrantForAnother(t *testing.T) {
	type held struct {
		capacity uint32
		perFill  uint32
		interval time.Duration
	}
	envoySame := func(a, b held) bool {
		return a.capacity == b.capacity && a.perFill == b.perFill && a.interval%time.Second == b.interval%time.Second
	}
	rate := func(h held) float64 { return float64(h.perFill) / math.Floor(h.interval.Seconds()) }
	sent := func(q uint32, f int64, c uint32) held {
		perFill, interval, _ := plan.TokenBucket(q, f)
		return held{c, perFill, interval}
	}
	var all []held
	for _, f := range []int64{1, 10, 60, 3600} {
		for q := uint32(0); q < 300; q++ {
			for c := uint32(1); c <= 3; c++ {
				all = append(all, sent(q, f, c))
			}
		}
	}
	var before []held // what the build before sent: q per period, whole seconds
	for _, f := range []int64{1, 10, 60, 3600} {
		for q := uint32(1); q < 3000; q++ {
			for c := uint32(1); c <= 3; c++ {
				before = append(before, held{c, q, time.Duration(f) * time.Second})
			}
		}
	}
	for i, a := range all {
		for _, b := range all[i+1:] {
			if envoySame(a, b) && rate(a) != rate(b) {
				t.Fatalf("Envoy takes %+v for %+v: %.3f a second kept where %.3f was sent", b, a, rate(a), rate(b))
			}
		}
		for _, b := range before {
			if envoySame(a, b) {
				t.Fatalf("Envoy takes %+v for the build before's %+v: %.3f a second kept where %.3f was sent", a, b, rate(b), rate(a))
			}
		}
	}
}

// TestCapacityKeptThroughCuts: a bucket keeps the capacity it holds when
// its grant is cut to fit a full pool; it grows only on a round's first
// try or when its token bucket starts full anyway, and shrinks only for a
// grant too small to carry 2. (Cut to capacity 1 round after round, 3
// equal Envoys with Poisson arrivals used 60% of their limit.) On the
// round's first try, a token bucket that starts full takes the capacity
// its demand calls for, and one in force grows to it.
func TestCapacityKeptThroughCuts(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name    string
		sentCap uint64
		lapsed  bool
		q       uint32
		mayGrow bool
		demand  float64 // requests per second
		want    uint64
	}{
		{"held 2, cut to 7: keeps 2", 2, false, 7, false, 0, 2},
		{"held 2, cut to 4: keeps 2", 2, false, 4, false, 0, 2},
		{"held 2, cut to 3: shrinks", 2, false, 3, false, 0, 1},
		{"held 1, first try at 9: grows", 1, false, 9, true, 0, 2},
		{"held 1, cut to 8: does not grow", 1, false, 8, false, 0, 1},
		{"held 1, first try at 5: stays", 1, false, 5, true, 0, 1},
		{"held 1, first try at 5, wanting 20/s: grows", 1, false, 5, true, 20, 2},
		{"held 1, cut to 5, wanting 20/s: stays", 1, false, 5, false, 20, 1},
		{"starts full at 9", 1, true, 9, false, 0, 2},
		{"starts full at 5", 2, true, 5, true, 0, 1},
		{"starts full at 5, wanting 20/s", 1, true, 5, true, 20, 2},
		{"starts full at 5, unmeasured", 1, true, 5, true, math.Inf(1), 2},
		{"starts full, cut to 5", 1, true, 5, false, math.Inf(1), 1},
		{"starts full at 5, wanting 3/s", 1, true, 5, true, 3, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := bare(Options{})
			b := &bucket{sentKind: kindLimited, sentQ: 9, sentF: 1, sentCap: tc.sentCap, sent: now, lapsed: tc.lapsed, demand: tc.demand,
				members: []*member{{l: newLedger(time.Second), p: &pool{key: "k"}}}}
			if j := s.sizedJob(b, now, tc.q, 1, tc.mayGrow); j.capacity != tc.want {
				t.Errorf("capacity %d, want %d", j.capacity, tc.want)
			}
		})
	}
}

// TestEveryGrantCarriesNineTenths: a grant of q tokens per period goes to
// the Envoy as 10q + 9 tokens every 10 periods (q + 0.9 a period, see
// fillPeriods), whole seconds as Envoy 1.40 needs and as many nanoseconds
// as the period has seconds (see tokenBucket); a bucket that holds a
// share of no whole token still gets its 0.9 (9 tokens every 10
// periods), and one that holds none gets no token bucket.
func TestEveryGrantCarriesNineTenths(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name      string
		target    float64 // tokens per second
		holds     bool
		period    time.Duration
		perFill   uint32
		intervalS int64
	}{
		{"8 a second", 8, true, time.Second, 89, 10},
		{"a share of no whole token", 0.4, true, time.Second, 9, 10},
		{"300 a minute", 5, true, time.Minute, 3009, 600},
		{"no share", 0, false, time.Second, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := bare(Options{})
			p := &pool{key: "k", rule: limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 30, Period: tc.period}, members: map[*member]struct{}{}, frac: 1}
			b := &bucket{kind: kindLimited, demand: 1}
			m := &member{b: b, p: p, l: newLedger(tc.period), target: tc.target, holds: tc.holds}
			b.members = []*member{m}
			j := s.jobFor(b, now)
			if !tc.holds {
				if j != nil && j.kind == kindLimited {
					t.Fatalf("a bucket with no share was sent a token bucket")
				}
				return
			}
			tb := s.action(nil, j).GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
			if tb.GetTokensPerFill().GetValue() != tc.perFill || tb.GetFillInterval().GetSeconds() != tc.intervalS || int64(tb.GetFillInterval().GetNanos()) != int64(tc.period/time.Second) {
				t.Errorf("sent %d tokens every %v, want %d every %d s", tb.GetTokensPerFill().GetValue(), tb.GetFillInterval().AsDuration(), tc.perFill, tc.intervalS)
			}
		})
	}
}
