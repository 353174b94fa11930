// Package limitertest is the conformance suite every limiter.Store must pass.
// The memory store runs it in its own tests and the Redis store runs the very
// same suite against real Redis servers, so a difference between backends is
// a failing test rather than a production surprise.
//
// Scenarios are step tables at named instants; no step reads the wall clock.
package limitertest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

// T0 is the suite's first instant: a whole hour, so minute and second windows
// start exactly on it.
var T0 = time.Unix(1_699_999_200, 0)

// Step is one call in a scenario: at T0+At, apply the hits and expect Want.
type Step struct {
	At           time.Duration
	Hits         []limiter.Hit // keys are relative; the suite prefixes them
	AllOrNothing bool
	DryRun       bool
	Want         []limiter.Outcome
}

// Scenario is a named sequence of steps against one fresh key space.
type Scenario struct {
	Name  string
	Steps []Step
}

// Run runs every scenario and the concurrency check against stores made by
// newStore. Each scenario gets its own key prefix, so one store may serve them
// all.
func Run(t *testing.T, newStore func(t *testing.T) limiter.Store) {
	t.Helper()
	for _, sc := range Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			st := newStore(t)
			prefix := keyPrefix(t)
			for i, s := range sc.Steps {
				hits := make([]limiter.Hit, len(s.Hits))
				for j, h := range s.Hits {
					h.Key = prefix + h.Key
					hits[j] = h
				}
				got, err := st.Apply(context.Background(), limiter.Batch{Now: T0.Add(s.At), Hits: hits, AllOrNothing: s.AllOrNothing, DryRun: s.DryRun})
				if err != nil {
					t.Fatalf("step %d: Apply() error: %v", i, err)
				}
				if fmt.Sprint(got) != fmt.Sprint(s.Want) {
					t.Errorf("step %d at T0+%v: Apply() =\n  %+v\nwant\n  %+v", i, s.At, got, s.Want)
				}
			}
		})
	}
	t.Run("concurrent/limit_never_exceeded", func(t *testing.T) {
		testConcurrent(t, newStore(t), keyPrefix(t))
	})
	t.Run("sliding_log/worst_span_random", func(t *testing.T) {
		testWorstSpan(t, newStore(t), keyPrefix(t))
	})
}

// testWorstSpan offers a sliding log random hits (weights 1 to 3, gaps of
// 0 to 3 s, some at the very same instant) for several windows and checks
// the log's promise: in no half-open span of one window are more hits
// allowed than the limit, and a hit is rejected only when it would not
// have fit.
func testWorstSpan(t *testing.T, st limiter.Store, prefix string) {
	const limit, period = 7, 10 * time.Second
	r := limiter.Rule{Algorithm: limiter.SlidingLog, Limit: limit, Period: period}
	rng := rand.New(rand.NewPCG(3, 5))
	type allowed struct {
		at   time.Duration
		cost uint64
	}
	var got []allowed
	at := time.Duration(0)
	for i := range 600 {
		if rng.IntN(4) > 0 {
			at += time.Duration(rng.IntN(3000)) * time.Millisecond
		}
		cost := uint64(1 + rng.IntN(3))
		out, err := st.Apply(context.Background(), limiter.Batch{Now: T0.Add(at), Hits: []limiter.Hit{{Key: prefix + "log", Rule: r, Cost: cost}}})
		if err != nil {
			t.Fatal(err)
		}
		var inSpan uint64 // allowed hits in (at-period, at]
		for _, a := range got {
			if a.at > at-period {
				inSpan += a.cost
			}
		}
		if fits := inSpan+cost <= limit; out[0].Allowed != fits {
			t.Fatalf("hit %d (cost %d at %v, %d in the span): allowed %v, want %v", i, cost, at, inSpan, out[0].Allowed, fits)
		}
		if out[0].Allowed {
			got = append(got, allowed{at, cost})
		}
	}
	worst := uint64(0)
	for _, end := range got { // every span (end-period, end] that ends on a hit
		var n uint64
		for _, a := range got {
			if a.at > end.at-period && a.at <= end.at {
				n += a.cost
			}
		}
		worst = max(worst, n)
	}
	if worst > limit {
		t.Errorf("worst span of %v held %d hits, over the limit of %d", period, worst, limit)
	}
	if len(got) == 0 {
		t.Error("no hit allowed at all")
	}
}

func keyPrefix(t *testing.T) string {
	return strings.NewReplacer("/", ":", " ", "_").Replace(t.Name()) + fmt.Sprintf(":%d:", time.Now().UnixNano())
}

// testConcurrent has 64 goroutines race for one fixed-window key at one
// instant: exactly Limit hits must be allowed.
func testConcurrent(t *testing.T, st limiter.Store, prefix string) {
	const workers, perWorker, limit = 64, 8, 100
	r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: limit, Period: time.Hour}
	if got := Allowed(t, []limiter.Store{st}, prefix+"hot", r, T0, workers, perWorker); got != limit {
		t.Errorf("%d goroutines x %d hits on a limit of %d: allowed %d, want exactly %d", workers, perWorker, limit, got, limit)
	}
}

// Allowed sends workers goroutines of perWorker one-hit calls each on key
// under r at now (the stores' clock when zero), the goroutines spread over
// stores in turn (replicas sharing one backend), and returns how many were
// allowed. An error fails the test.
func Allowed(t *testing.T, stores []limiter.Store, key string, r limiter.Rule, now time.Time, workers, perWorker int) int64 {
	t.Helper()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		st := stores[w%len(stores)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perWorker {
				out, err := st.Apply(context.Background(), limiter.Batch{Now: now, Hits: []limiter.Hit{{Key: key, Rule: r, Cost: 1}}})
				if err != nil {
					errs <- err
					return
				}
				if out[0].Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Apply() error: %v", err)
	}
	return allowed.Load()
}
