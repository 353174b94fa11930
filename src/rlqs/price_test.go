package rlqs

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/rlqs/plan"
	"github.com/openrls/ratelimit/src/rlqs/rlqstest"
)

// TestLightPoissonBucketsCostMoreThanTheirShare is the price of exactness
// that docs/rlqs.md gives for the patterns of one heavy Envoy beside light
// ones with Poisson arrivals on 30 a second, worked with the model of
// Envoy 1.40's token bucket the ledger is held to. A token bucket costs
// every window its capacity (the tokens it may carry in) and the whole
// tokens it refills there (the 0.9 every grant carries is free). The goal
// asks 0.9 of what is left (the limit less a token for each Envoy) and
// each Envoy 0.8 of its max-min share of it. With one heavy (40 a second)
// and nine light ones (1 a second), the heavy one's share is 11, and 10
// a window admit 0.8 of it, leaving 20 to the light ones. A
// light bucket admits 0.8 of its requests only at a cost of 3 a window
// (capacity 2, refilled at 1.9 a second); held only part of the time (the
// rest denied), to admit 0.8 on average, it costs at least 0.8 / f ×
// (capacity + refill) on average, where f is what it admits while held.
// Nine of them cost more than 20 either way. With one heavy (20 a second)
// and four light ones (2 a second), the heavy one's share is 17, 0.8 of
// which takes 17 a window (its own Poisson arrivals leave some refills
// unused too), and a light one 4 a window: no assignment of token buckets,
// steady or taking turns, meets the goal in either pattern.
func TestLightPoissonBucketsCostMoreThanTheirShare(t *testing.T) {
	// admits is what a token bucket of capacity c refilled with q whole
	// tokens a second (and the free 0.9) admits of Poisson requests at
	// lambda a second, as a share of them.
	admits := func(lambda float64, c uint64, q uint32) float64 {
		rng := rand.New(rand.NewPCG(c, uint64(q)))
		perFill, interval, _ := plan.TokenBucket(q, 1)
		now := time.Unix(1_700_000_000, 0)
		var e envoyBucket
		e.install(now, perFill, interval, c, 365*24*time.Hour)
		asked, admitted := 20_000, 0
		for range asked {
			now = now.Add(time.Duration(rng.ExpFloat64() / lambda * float64(time.Second)))
			e.refill(now)
			if e.tokens >= 1 {
				e.tokens--
				admitted++
			}
		}
		return float64(admitted) / float64(asked)
	}
	// cheapest is the least a window costs that admits at least want a
	// second of requests at lambda a second, steady, and taking turns.
	cheapest := func(lambda, want float64) (steady, turns float64) {
		steady, turns = math.Inf(1), math.Inf(1)
		for c := uint64(1); c <= 8; c++ {
			for q := uint32(0); q <= 30; q++ {
				cost, f := float64(c)+float64(q), admits(lambda, c, q)
				if f*lambda >= want {
					steady = math.Min(steady, cost)
					turns = math.Min(turns, cost*want/(f*lambda))
				}
			}
		}
		return steady, turns
	}
	for _, tc := range []struct {
		name                 string
		heavy, share         float64 // the heavy Envoy's rate, and its max-min share of what is left
		lights               int
		light                float64
		heavyCost, lightCost float64 // a window, as docs/rlqs.md gives them
	}{
		{"1 heavy (40/s) + 9 light (1/s)", 40, 11, 9, 1, 10, 3},
		{"1 heavy (20/s) + 4 light (2/s)", 20, 17, 4, 2, 17, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			heavy, _ := cheapest(tc.heavy, 0.8*tc.share)
			steady, turns := cheapest(tc.light, 0.8*tc.light)
			if heavy != tc.heavyCost || steady != tc.lightCost {
				t.Errorf("0.8 of its share costs the heavy bucket %v a window and a light one %v: docs/rlqs.md says %v and %v", heavy, steady, tc.heavyCost, tc.lightCost)
			}
			if left := 30 - heavy; float64(tc.lights)*turns <= left {
				t.Errorf("the light buckets taking turns cost %.1f a window, within the %v the heavy one leaves: the goal is reachable", float64(tc.lights)*turns, left)
			}
			t.Logf("the heavy one costs %v a window; the light ones at least %.0f held steady, %.1f taking turns, of the %v it leaves",
				heavy, float64(tc.lights)*steady, float64(tc.lights)*turns, 30-heavy)
		})
	}
}

// TestBurstsAtTheReportIntervalCannotBeFollowed is the bound docs/rlqs.md
// gives for the bursty pattern at 1 s reports, worked from the pattern's
// own definition and the service's defaults. Its Envoys leave one or two
// of them on in turns shorter than the least a move of room can take at
// 1 s reports on average (half a report interval for the change to be
// reported, half a push for the round of a rise, and the delivery bound
// of the fall's lowered grant). Kept instead, three token buckets costing
// a third of the limit each admit at most their refill while on: at best
// 0.62 of what is left, short of the goal's 0.9.
func TestBurstsAtTheReportIntervalCannotBeFollowed(t *testing.T) {
	var pt rlqstest.Pattern
	for _, p := range rlqstest.Patterns() {
		if p.Bursts > 0 {
			pt = p
		}
	}
	limit, _ := pt.Window()
	begin := time.Unix(1_700_000_000, 0)
	const step = 10 * time.Millisecond
	cycle := 2 * pt.Bursts
	var turns []time.Duration
	last, since, left, on := -1, time.Duration(0), 0.0, 0.0
	for at := time.Duration(0); at < 2*cycle; at += step {
		n := 0
		for i := range pt.Demands {
			if pt.Active(i, begin, begin.Add(at)) {
				n++
			}
		}
		if at >= cycle { // one whole cycle, its turns and what it leaves
			if n != last && last >= 0 {
				turns = append(turns, at-since)
				since = at
			}
			asked := float64(n) * pt.Demands[0]
			left += math.Min(asked, limit-float64(n)) * step.Seconds()
			on += float64(n) * step.Seconds()
		} else if n != last {
			since = at
		}
		last = n
	}
	left, on = left/cycle.Seconds(), on/cycle.Seconds()
	move := time.Second/2 + DefaultPush/2 + DefaultDelivery
	for _, d := range turns {
		if d >= move {
			t.Errorf("a turn of %v outlasts a move of room (%v on average): the bursts could be followed", d, move)
		}
	}
	best := 0.0
	for c := 1.0; c <= 4; c++ {
		q := math.Floor(limit/float64(len(pt.Demands))) - c // each bucket's whole refill a window
		best = math.Max(best, on*math.Min(q+plan.ExtraPerPeriod, pt.Demands[0])/left)
	}
	if math.Abs(best-0.62) > 0.005 || best >= 0.9 {
		t.Errorf("kept grants use at best %.3f of what is left: docs/rlqs.md says 0.62", best)
	}
	t.Logf("turns %v; %.1f Envoys on and %.1f a second left on average; kept grants use at best %.2f of it", turns, on, left, best)
}
