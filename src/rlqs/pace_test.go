package rlqs

import (
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestReportPacer: a stream's reports are taken in at reportsPerSecond
// after a burst of reportBurst, on the service's clock.
func TestReportPacer(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name  string
		every time.Duration // between reports
		n     int
		want  int // taken in
	}{
		{"Envoy, every second", time.Second, 30, 30},
		{"every 50 ms, the pace", time.Second / reportsPerSecond, 300, 300},
		{"a burst at one instant", 0, 500, reportBurst},
		{"every ms for 10 s", time.Millisecond, 10000, reportBurst + 10*reportsPerSecond},
	} {
		p := reportPacer{tokens: reportBurst, last: start}
		took := 0
		for i := range tc.n {
			if p.take(start.Add(time.Duration(i) * tc.every)) {
				took++
			}
		}
		// The last report's instant counts its own token: one either way.
		if took < tc.want-1 || took > tc.want+1 {
			t.Errorf("%s: took in %d of %d, want %d", tc.name, took, tc.n, tc.want)
		}
	}
}

// TestHeldReportsMerge: reports past the pace are merged by bucket, every
// request and every second of time kept, in the order buckets came.
func TestHeldReportsMerge(t *testing.T) {
	s := New(Options{})
	usage := func(tenant string, allowed, denied uint64, elapsed time.Duration) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
		return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": tenant}},
			NumRequestsAllowed: allowed, NumRequestsDenied: denied, TimeElapsed: durationpb.New(elapsed)}
	}
	h := s.hold(nil, &rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage("a", 1, 2, time.Millisecond), usage("b", 3, 0, time.Millisecond)}})
	first := h.order[0]
	h = s.hold(h, &rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage("a", 10, 20, 2*time.Millisecond)}})
	got := h.report(s, &rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage("c", 5, 5, time.Second), usage("b", 1, 1, time.Second)}})
	want := &rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage("a", 11, 22, 3*time.Millisecond), usage("b", 4, 1, time.Second+time.Millisecond), usage("c", 5, 5, time.Second)}}
	if !proto.Equal(got, want) {
		t.Errorf("merged:\n%v\nwant\n%v", got, want)
	}
	if first.GetNumRequestsAllowed() != 11 {
		t.Error("held usages are not merged in place")
	}
}

// TestSplitResponse: a push past the size bound goes as several
// messages, each under it unless one action alone is larger, every action
// once, in order.
func TestSplitResponse(t *testing.T) {
	action := func(i, size int) *rlqsv3.RateLimitQuotaResponse_BucketAction {
		return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{
			"i": strings.Repeat("x", size) + string(rune('a'+i%26))}}}
	}
	for _, tc := range []struct {
		name    string
		actions []int // sizes
		max     int
		parts   int
	}{
		{"fits", []int{10, 10, 10}, 1000, 1},
		{"three by two", []int{300, 300, 300, 300, 300, 300}, 700, 3},
		{"one alone too large", []int{10, 5000, 10}, 1000, 3},
		{"none", nil, 100, 1},
	} {
		msg := &rlqsv3.RateLimitQuotaResponse{}
		for i, n := range tc.actions {
			msg.BucketAction = append(msg.BucketAction, action(i, n))
		}
		parts := splitResponse(msg, tc.max)
		if len(parts) != tc.parts {
			t.Errorf("%s: %d parts, want %d", tc.name, len(parts), tc.parts)
		}
		var all []*rlqsv3.RateLimitQuotaResponse_BucketAction
		for _, p := range parts {
			if size := proto.Size(p); size > tc.max && len(p.BucketAction) > 1 {
				t.Errorf("%s: a part of %d bytes and %d actions, past %d", tc.name, size, len(p.BucketAction), tc.max)
			}
			all = append(all, p.BucketAction...)
		}
		if !proto.Equal(&rlqsv3.RateLimitQuotaResponse{BucketAction: all}, msg) {
			t.Errorf("%s: the parts' actions are not the message's, in order", tc.name)
		}
	}
}

// TestReportCounter: a stream may report max bucket usages in a second
// of the clock, not one more; the next second starts again.
func TestReportCounter(t *testing.T) {
	var c reportCounter
	at := time.Unix(1_700_000_000, 0)
	for i := range 100 {
		if !c.count(at.Add(time.Duration(i)*time.Millisecond), 10, 1000) {
			t.Fatalf("report %d refused within the bound", i+1)
		}
	}
	if c.count(at.Add(999*time.Millisecond), 1, 1000) {
		t.Error("one usage past the bound within the second taken")
	}
	if !c.count(at.Add(time.Second), 1000, 1000) {
		t.Error("the next second's reports refused")
	}
}

// TestFloodedAddressesCoolDown: once a stream of an address was ended for
// its report rate, that address's new streams are refused for
// floodCooldown on the service's clock, and only that address's.
func TestFloodedAddressesCoolDown(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s := New(Options{Clock: func() time.Time { return now }})
	s.cool("192.0.2.1", now)
	if _, err := s.open("192.0.2.1"); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a new stream of the flooding address: %v, want ResourceExhausted", err)
	}
	if _, err := s.open("192.0.2.2"); err != nil {
		t.Errorf("another address's stream: %v", err)
	}
	now = now.Add(floodCooldown)
	if _, err := s.open("192.0.2.1"); err != nil {
		t.Errorf("after the cooldown: %v", err)
	}
}
