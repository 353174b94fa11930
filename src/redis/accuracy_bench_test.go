package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/limiter/limitertest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// BenchmarkAccuracy (part of make bench) offers every algorithm three times
// its limit, as random arrivals on a virtual clock, for 60 windows, once
// starting on a window boundary and once at a random phase, against the
// memory store and Redis. It prints what each allowed against the ideal
// (the limit per window over the run; a token bucket's burst on top), the
// worst span (the most hits allowed in any span of one window), the time a
// decision took and what a key holds. Virtual time: the run takes seconds,
// not the ten minutes it describes.
func BenchmarkAccuracy(b *testing.B) {
	const limit, period, windows = 100, 10 * time.Second, 60
	srv := redistest.Start(b)
	rs := newStore(b, single(b, srv), Options{})
	mem := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
	defer mem.Close()
	stores := []struct {
		name string
		st   limiter.Store
	}{{"memory", mem}, {"redis", rs}}
	algs := []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindow, limiter.TokenBucket, limiter.SlidingLog}
	for range b.N {
		rows := []string{
			fmt.Sprintf("offered: 3x the limit (%d per %v), random arrivals, %d windows", limit, period, windows),
			"| algorithm | store | phase | allowed | ideal | allowed/ideal | worst span | worst span/limit | µs per decision | bytes per key (Redis MEMORY USAGE) |",
			"|---|---|---|---|---|---|---|---|---|---|",
		}
		for _, alg := range algs {
			r := limiter.Rule{Algorithm: alg, Limit: limit, Period: period}
			for _, s := range stores {
				for _, phase := range []string{"aligned", "random"} {
					rng := rand.New(rand.NewPCG(uint64(alg)+1, 42))
					start := limitertest.T0
					if phase == "random" {
						start = start.Add(time.Duration(rng.Int64N(int64(period))))
					}
					key := fmt.Sprintf("{acc:%d:%s:%s:%d}", alg, s.name, phase, time.Now().UnixNano())
					allowed, worst, perCall := offer(b, s.st, r, key, start, windows*period, 3*limit/period.Seconds(), rng)
					ideal := float64(limit) * windows
					if alg == limiter.TokenBucket {
						ideal += limit // the bucket starts full
					}
					usage := "-"
					if s.name == "redis" {
						usage, _ = srv.Do("MEMORY", "USAGE", keyVersion+key)
					}
					rows = append(rows, fmt.Sprintf("| %s | %s | %s | %d | %.0f | %.3f | %d | %.2f | %.1f | %s |", alg, s.name, phase,
						allowed, ideal, float64(allowed)/ideal, worst, float64(worst)/limit, perCall, usage))
				}
			}
		}
		rows = append(rows, "", fmt.Sprintf("sliding_log at the ceiling: a log of %d hits, then 200 more decisions", limiter.MaxLogLimit),
			"| store | µs per decision | bytes per key (Redis MEMORY USAGE) |", "|---|---|---|")
		for _, s := range stores {
			us, usage := fullLog(b, s.st, srv, s.name == "redis")
			rows = append(rows, fmt.Sprintf("| %s | %.1f | %s |", s.name, us, usage))
		}
		fmt.Fprintln(os.Stdout, strings.Join(rows, "\n"))
	}
}

// fullLog fills a sliding log to MaxLogLimit with one hit per call (the
// most entries a log can hold), then times decisions on it.
func fullLog(b *testing.B, st limiter.Store, srv *redistest.Server, redis bool) (usPerCall float64, usage string) {
	r := limiter.Rule{Algorithm: limiter.SlidingLog, Limit: limiter.MaxLogLimit, Period: time.Hour}
	key := fmt.Sprintf("{full:%d}", time.Now().UnixNano())
	at := limitertest.T0
	apply := func() {
		at = at.Add(time.Millisecond)
		if _, err := st.Apply(context.Background(), limiter.Batch{Now: at, Hits: []limiter.Hit{{Key: key, Rule: r, Cost: 1}}}); err != nil {
			b.Fatal(err)
		}
	}
	for range limiter.MaxLogLimit {
		apply()
	}
	began := time.Now()
	for range 200 {
		apply()
	}
	usage = "-"
	if redis {
		usage, _ = srv.Do("MEMORY", "USAGE", keyVersion+key)
	}
	return float64(time.Since(began).Microseconds()) / 200, usage
}

// offer sends random arrivals at rate per second of virtual time for d from
// start, one hit each, and returns how many were allowed, the most allowed
// in any half-open span of one period, and the wall time per decision in µs.
func offer(b *testing.B, st limiter.Store, r limiter.Rule, key string, start time.Time, d time.Duration, rate float64, rng *rand.Rand) (allowed, worst int, usPerCall float64) {
	var times []time.Duration
	at, calls := time.Duration(0), 0
	began := time.Now()
	for at < d {
		at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		out, err := st.Apply(context.Background(), limiter.Batch{Now: start.Add(at), Hits: []limiter.Hit{{Key: key, Rule: r, Cost: 1}}})
		if err != nil {
			b.Fatal(err)
		}
		calls++
		if out[0].Allowed {
			times = append(times, at)
		}
	}
	usPerCall = float64(time.Since(began).Microseconds()) / float64(calls)
	lo := 0
	for hi := range times { // spans (times[hi]-period, times[hi]]
		for times[lo] <= times[hi]-r.Period {
			lo++
		}
		worst = max(worst, hi-lo+1)
	}
	return len(times), worst, usPerCall
}
