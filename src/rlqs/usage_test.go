package rlqs

import (
	"fmt"
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

// A bucket's demand follows a change that falls mid-interval at once, read
// through noteUsage as reports arrive 5 s apart: a rise is carried on by
// the change, a fall only to half the rate measured, and a difference
// chance makes (within three standard deviations of Poisson counts) is
// read with the reports before it since the last change, over 20 s of
// them, or further back, to a minute, while those hold under 20 requests.
func TestDemandFollowsAChangeAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reports []uint64 // requests per 5 s report; the first opens the bucket
		want    float64
	}{
		{"first measure", []uint64{1, 100}, 20.2},
		{"steady: both reports", []uint64{1, 100, 100}, 201.0 / 10},
		{"noise within chance: both reports", []uint64{1, 100, 115}, 216.0 / 10},
		{"steady: the last four reports", []uint64{1, 100, 100, 100, 100, 120}, 420.0 / 20},
		{"a paced light bucket: 2 and 3 in turn, read over every report (13 requests in 25 s)", []uint64{1, 2, 3, 2, 3, 2}, 13.0 / 25},
		{"a bucket with 20 requests in 20 s: read over those", []uint64{1, 5, 5, 5, 5, 5, 5}, 20.0 / 20},
		{"rise halfway through", []uint64{1, 0, 100}, 2*20 - 0.2},
		{"rise late: read short, then past it once", []uint64{1, 0, 40, 200}, 2*40 - 8},
		{"rise late, then steady", []uint64{1, 0, 40, 200, 200}, 40},
		{"stop halfway through: half what is measured", []uint64{1, 200, 100}, 10},
		{"a fall carried on", []uint64{1, 200, 140}, 2*28 - 40.2},
		{"fall, then steady", []uint64{1, 200, 100, 100}, 20},
		{"idle", []uint64{1, 200, 0}, 0},
		{"idle, then idle", []uint64{1, 200, 0, 0}, 0},
		{"light and steady", []uint64{1, 5, 8}, 14.0 / 10},
		{"on and off once: followed", []uint64{1, 0, 100, 0}, 0},
		{"bursting: the peak held through a lull", []uint64{1, 0, 100, 0, 100, 0}, 20},
		{"bursting, then steady: the peak held", []uint64{1, 0, 100, 0, 100, 0, 0}, 20},
		{"bursting, then steady past the span: followed", []uint64{1, 0, 100, 0, 100, 0, 0, 0, 0}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1_700_000_000, 0)
			b := &bucket{lastReport: now, demand: math.Inf(1)}
			for i, n := range tc.reports {
				if i > 0 {
					now = now.Add(5 * time.Second)
				}
				b.noteUsage(&rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{NumRequestsAllowed: n / 2, NumRequestsDenied: n - n/2}, now)
			}
			if math.Abs(b.demand-tc.want) > 1e-9 {
				t.Errorf("demand %v a second, want %v", b.demand, tc.want)
			}
		})
	}
}

// A report is answered at once (its buckets are due a round) when it
// creates a bucket, measures one for the first time or lowers one's
// demand past chance; a steady report, or a rise, waits for the next
// push.
func TestAChangeOfDemandIsAnsweredAtOnce(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s, st := fleetStream(t, func() time.Time { return now })
	for i, step := range []struct {
		requests uint64
		due      bool
	}{
		{1, true},    // a new bucket
		{100, true},  // first measured: 20 a second
		{100, false}, // steady
		{110, false}, // within chance
		{0, true},    // stopped
		{0, false},   // still stopped
		{200, false}, // back: a rise waits
		{0, true},    // stopped again
	} {
		if i > 0 {
			now = now.Add(5 * time.Second)
		}
		due := s.report(st, &rlqsv3.RateLimitQuotaUsageReports{Domain: "fleet", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "a"}}, NumRequestsAllowed: step.requests}}})
		if got := len(due) == 1; got != step.due || len(due) > 1 {
			t.Errorf("report %d (%d requests): %d buckets due a round, want due %v", i, step.requests, len(due), step.due)
		}
	}
}

// A client that sends each bucket's fall in a message of its own gets at
// most one round at once a push for its stream: the rest wait for the
// push, which answers them all in one round.
func TestFallsAreAnsweredAtOnceAtMostOnceAPush(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s, st := fleetStream(t, func() time.Time { return now })
	one := func(id string, n uint64) int {
		return len(s.report(st, &rlqsv3.RateLimitQuotaUsageReports{Domain: "fleet", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": id}}, NumRequestsAllowed: n}}}))
	}
	const buckets = 50
	for i := range buckets {
		one(fmt.Sprint(i), 1) // new: each due at once
	}
	for _, n := range []uint64{500, 0} { // measured, then stopped
		now = now.Add(5 * time.Second)
		due := 0
		for i := range buckets {
			due += one(fmt.Sprint(i), n)
			now = now.Add(time.Millisecond)
		}
		if due != 1 {
			t.Errorf("%d single-bucket reports of %d requests within a push: %d due a round at once, want 1", buckets, n, due)
		}
	}
}
