package rlqs

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestLightPoissonBucketsCostMoreThanTheirShare is the price of exactness
// that docs/rlqs.md gives for the pattern of one heavy Envoy (40 a second)
// beside nine light ones (1 a second, Poisson arrivals) on 30 a second,
// worked with the model of Envoy 1.40's token bucket the ledger is held
// to. A token bucket costs every window its capacity (the tokens it may
// carry in) and the whole tokens it refills there (the 0.9 every grant
// carries is free). For a light bucket to admit 0.8 of its requests, as
// the goal asks of its share, it must cost at least 3 a window; nine then
// cost 27 of the 30, and the heavy one, whose max-min share of what is
// left (20: a token for each of the ten) is 11, can be refilled at no
// more than 1.9 a second: far under 0.8 of it. No assignment of token
// buckets meets both the fairness and the 90% the goal asks; the service
// gives the light ones a capacity of 1 and a token a second and the heavy
// one the rest, which uses more of the limit and serves them less.
func TestLightPoissonBucketsCostMoreThanTheirShare(t *testing.T) {
	admits := func(c uint64, q uint32) float64 {
		rng := rand.New(rand.NewPCG(c, uint64(q)))
		perFill, interval, _ := tokenBucket(q, 1)
		now := time.Unix(1_700_000_000, 0)
		var e envoyBucket
		e.install(now, perFill, interval, c, 365*24*time.Hour)
		asked, admitted := 20_000, 0
		for range asked {
			now = now.Add(time.Duration(rng.ExpFloat64() * float64(time.Second)))
			e.refill(now)
			if e.tokens >= 1 {
				e.tokens--
				admitted++
			}
		}
		return float64(admitted) / float64(asked)
	}
	cheapest := uint64(math.MaxUint64)
	for c := uint64(1); c <= 6; c++ {
		for q := uint32(0); q <= 4; q++ {
			if a := admits(c, q); a >= 0.8 {
				cheapest = min(cheapest, c+uint64(q))
			}
		}
	}
	if cheapest < 3 {
		t.Fatalf("a light bucket admits 0.8 of its requests at a cost of %d a window: docs/rlqs.md says 3", cheapest)
	}
	heavy := 30 - 9*float64(cheapest) - plainCapacity + extraPerPeriod
	if share := 11.0; heavy >= 0.8*share {
		t.Errorf("the heavy one can be refilled at %.1f a second, 0.8 of its share of %.0f: the goal is reachable", heavy, share)
	}
	t.Logf("capacity 1, 1.9 a second: %.2f of the requests; capacity 2, 1.9 a second: %.2f; the cheapest at 0.8: %d a window",
		admits(1, 1), admits(2, 1), cheapest)
}
