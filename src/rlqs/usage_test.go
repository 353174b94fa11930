package rlqs

import (
	"math"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
)

// Reports near 2^64 saturate the bucket's count of requests instead of
// wrapping it to a small number (which skewed its demand).
func TestUsageSumsSaturate(t *testing.T) {
	for _, tc := range []struct {
		name            string
		allowed, denied uint64
		before, want    uint64
	}{
		{"small", 3, 4, 0, 7},
		{"allowed + denied past 2^64", math.MaxUint64 - 1, 5, 0, math.MaxUint64},
		{"onto a count near 2^64", 10, 0, math.MaxUint64 - 3, math.MaxUint64},
		{"both at the top", math.MaxUint64, math.MaxUint64, math.MaxUint64, math.MaxUint64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Now()
			b := &bucket{counted: tc.before, lastReport: now}
			b.noteUsage(&rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{NumRequestsAllowed: tc.allowed, NumRequestsDenied: tc.denied}, now)
			if b.counted != tc.want {
				t.Errorf("counted %d, want %d", b.counted, tc.want)
			}
		})
	}
}
