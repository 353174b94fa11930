package limiter_test

import (
	"context"
	"fmt"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

// A store decides hits against rules: here 2 per minute in a fixed window,
// at a given instant so that the answer is the same on every run.
func ExampleMemoryStore() {
	s := limiter.NewMemoryStore(limiter.MemoryOptions{})
	defer s.Close()
	rule := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 2, Period: time.Minute}
	at := time.Date(2026, 1, 1, 12, 0, 15, 0, time.UTC)
	for range 3 {
		outs, _ := s.Apply(context.Background(), limiter.Batch{Now: at, Hits: []limiter.Hit{{Key: "user-1", Rule: rule, Cost: 1}}})
		fmt.Println(outs[0].Allowed, outs[0].Remaining, outs[0].ResetAfter)
	}
	// Output:
	// true 1 45s
	// true 0 45s
	// false 0 45s
}
