package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/limiter/limitertest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// TestScriptsMatchGoOnRandomSchedules runs one random schedule of hits,
// refunds, checks, overdraft and counted rejections, on every algorithm, against the memory
// store (the Go arithmetic) and the Redis store (the Lua mirror of it), and
// requires the same outcome at every step.
func TestScriptsMatchGoOnRandomSchedules(t *testing.T) {
	rs := newStore(t, single(t, redistest.Start(t)), Options{})
	mem := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
	defer mem.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	var rules []limiter.Rule
	for _, alg := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindow, limiter.TokenBucket, limiter.SlidingLog, limiter.Concurrency} {
		for _, od := range []bool{false, true} {
			rules = append(rules,
				limiter.Rule{Algorithm: alg, Limit: 7, Period: 10 * time.Second, Overdraft: od},
				limiter.Rule{Algorithm: alg, Limit: 3, Period: time.Minute, Burst: uint64(map[bool]int{true: 5}[alg == limiter.TokenBucket]), Overdraft: od})
		}
	}
	// envoyproxy/ratelimit's counting, the default of a fixed window.
	rules = append(rules,
		limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 7, Period: 10 * time.Second, CountRejected: true},
		limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 3, Period: time.Minute, CountRejected: true})
	now := limitertest.T0
	prefix := fmt.Sprintf("diff:%d:", time.Now().UnixNano())
	for step := range 3000 {
		now = now.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
		n := 1 + rng.IntN(3)
		hits := make([]limiter.Hit, n)
		for i := range hits {
			ri := rng.IntN(len(rules))
			hits[i] = limiter.Hit{Key: fmt.Sprintf("%s{k%d}", prefix, ri), Rule: rules[ri],
				Cost: uint64(rng.IntN(9)), Refund: rng.IntN(4) == 0, Advisory: rng.IntN(8) == 0}
		}
		b := limiter.Batch{Now: now, Hits: hits, AllOrNothing: rng.IntN(3) == 0}
		want, err := mem.Apply(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		got, err := rs.Apply(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("step %d at T0+%v, batch %+v:\nredis  %+v\nmemory %+v", step, now.Sub(limitertest.T0), b, got, want)
		}
	}
}
