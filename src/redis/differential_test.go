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
		agree(t, mem, rs, limiter.Batch{Now: now, Hits: hits, AllOrNothing: rng.IntN(3) == 0}, step)
	}
}

// TestCalendarScriptsMatchGo runs random schedules of calendar rules
// (days, weeks and months, fixed and sliding, in zones 14 hours ahead and
// across changes of clocks) through days of steps of up to two hours on
// the memory store and on Redis, which find their windows apart (Go from
// the rule, Lua from the block of windows the call carries), and requires
// the same outcome at every step.
func TestCalendarScriptsMatchGo(t *testing.T) {
	rs := newStore(t, single(t, redistest.Start(t)), Options{})
	mem := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
	defer mem.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	var rules []limiter.Rule
	for _, c := range []struct {
		unit limiter.CalendarUnit
		zone string
	}{{limiter.CalendarDay, "Pacific/Kiritimati"}, {limiter.CalendarDay, "America/New_York"}, {limiter.CalendarDay, "America/Havana"},
		{limiter.CalendarWeek, "UTC"}, {limiter.CalendarMonth, "Europe/Berlin"}} {
		loc, err := time.LoadLocation(c.zone)
		if err != nil {
			t.Fatal(err)
		}
		cal := &limiter.Calendar{Unit: c.unit, Zone: loc}
		for _, alg := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindow} {
			rules = append(rules, limiter.Rule{Algorithm: alg, Limit: 5, Period: 24 * time.Hour, Calendar: cal},
				limiter.Rule{Algorithm: alg, Limit: 5, Period: 24 * time.Hour, Calendar: cal, CountRejected: alg == limiter.FixedWindow})
		}
	}
	// From the last day of February, across New York's and Havana's change
	// of clocks (8 March), for about two weeks.
	now := time.Date(2026, 2, 27, 20, 0, 0, 0, time.UTC)
	prefix := fmt.Sprintf("cal:%d:", time.Now().UnixNano())
	for step := range 600 {
		now = now.Add(time.Duration(rng.IntN(7200)) * time.Second)
		hits := make([]limiter.Hit, 1+rng.IntN(3))
		for i := range hits {
			ri := rng.IntN(len(rules))
			hits[i] = limiter.Hit{Key: fmt.Sprintf("%s{k%d}", prefix, ri), Rule: rules[ri], Cost: uint64(rng.IntN(4)), Refund: rng.IntN(5) == 0}
		}
		agree(t, mem, rs, limiter.Batch{Now: now, Hits: hits, AllOrNothing: rng.IntN(3) == 0}, step)
	}
}

// agree applies b to the memory store (the Go arithmetic) and to Redis
// (its Lua mirror) and requires the same outcomes.
func agree(t *testing.T, mem *limiter.MemoryStore, rs *Store, b limiter.Batch, step int) {
	t.Helper()
	want, err := mem.Apply(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	got, err := rs.Apply(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("step %d at %v, batch %+v:\nredis  %+v\nmemory %+v", step, b.Now.UTC(), b, got, want)
	}
}
