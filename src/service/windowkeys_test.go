package service

import (
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

func TestWindowKeys(t *testing.T) {
	now := time.Unix(1_700_000_123, 0)
	for _, tc := range []struct {
		name string
		rule limiter.Rule
		want string
	}{
		{"fixed window: its window's counter", limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 5, Period: time.Minute},
			limiter.WindowKey("k", 1_700_000_123/60)},
		{"counting rejected hits too", limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 5, Period: time.Second, CountRejected: true},
			limiter.WindowKey("k", 1_700_000_123)},
		{"overdraft keeps its key", limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 5, Period: time.Second, Overdraft: true}, "k"},
		{"a leased rule keeps its key", limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 5, Period: time.Second, Lease: "r"}, "k"},
		{"a sliding window keeps its key", limiter.Rule{Algorithm: limiter.SlidingWindow, Limit: 5, Period: time.Second}, "k"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hits := []limiter.Hit{{Key: "k", Rule: tc.rule, Cost: 1}}
			windowKeys(hits, now)
			if hits[0].Key != tc.want {
				t.Errorf("key %q, want %q", hits[0].Key, tc.want)
			}
		})
	}
}
