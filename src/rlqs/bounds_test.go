package rlqs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/rlqs"
)

// TestHostileClientsAreBounded: a stream that reports more buckets than
// RLQS_MAX_BUCKETS_PER_STREAM, bucket ids past the size bounds, streams
// whose buckets together pass the service's bound, and more streams than
// RLQS_MAX_STREAMS: the excess is refused and counted, what is tracked
// stays within the bounds, and the stream stays open.
func TestHostileClientsAreBounded(t *testing.T) {
	t.Parallel()
	conn, svc := serveService(t, rlqs.Options{Configs: load(t, fleetConfig), MaxBuckets: 50, MaxStreams: 2, MaxTotalBuckets: 70})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := rlqsv3.NewRateLimitQuotaServiceClient(conn)
	st, err := client.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "fleet"}
	for i := range 5000 {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "t" + strconv.Itoa(i)}}, NumRequestsAllowed: 1})
	}
	wide := map[string]string{}
	for i := range 100 {
		wide["k"+strconv.Itoa(i)] = "v"
	}
	m.BucketQuotaUsages = append(m.BucketQuotaUsages,
		&rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: wide}},
		&rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": strings.Repeat("x", 5000)}}})
	if err := st.Send(m); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv() // the new buckets' answer: the stream is alive
	if err != nil {
		t.Fatalf("the stream closed: %v", err)
	}
	if n := len(resp.GetBucketAction()); n != 50 {
		t.Errorf("answered %d buckets, want the 50 the bound allows", n)
	}
	var view struct {
		Buckets int `json:"buckets"`
	}
	rec := httptest.NewRecorder()
	svc.DebugHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/rlqs", nil))
	if err := json.Unmarshal(rec.Body.Bytes(), &view); err != nil {
		t.Fatal(err)
	}
	if view.Buckets != 50 {
		t.Errorf("tracking %d buckets, want 50", view.Buckets)
	}
	// Two more streams, each opened by a report: the first may add only
	// 20 buckets before all streams together hold 70; the second is past
	// RLQS_MAX_STREAMS.
	hello := &rlqsv3.RateLimitQuotaUsageReports{Domain: "fleet"}
	for i := range 30 {
		hello.BucketQuotaUsages = append(hello.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "u" + strconv.Itoa(i)}}, NumRequestsAllowed: 1})
	}
	second, err := client.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Send(hello); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second stream to be served", func() bool {
		rec := httptest.NewRecorder()
		svc.DebugHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/rlqs", nil))
		var v struct {
			Streams int `json:"streams"`
		}
		return json.Unmarshal(rec.Body.Bytes(), &v) == nil && v.Streams == 2
	})
	waitFor(t, "the second stream's buckets, up to 70 in all", func() bool {
		rec := httptest.NewRecorder()
		svc.DebugHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/rlqs", nil))
		var v struct {
			Buckets int `json:"buckets"`
		}
		return json.Unmarshal(rec.Body.Bytes(), &v) == nil && v.Buckets == 70
	})
	hello.BucketQuotaUsages = nil
	tctx, tcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer tcancel()
	third, err := client.StreamRateLimitQuotas(tctx)
	if err == nil {
		_ = third.Send(hello)
		_, err = third.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a third stream: %v, want ResourceExhausted", err)
	}
}

// TestRoundsAskInSmallBatches: a stream's 2,000 new buckets, each with a
// limit of its own, are granted in store calls of at most 128 keys, so
// that ordinary calls on the same store wait behind one small call, not a
// round; and every bucket is answered.
func TestRoundsAskInSmallBatches(t *testing.T) {
	t.Parallel()
	rec := &rlqs.BatchRecorder{Store: limiter.NewMemoryStore(limiter.MemoryOptions{})}
	conn, _ := serveService(t, rlqs.Options{Configs: load(t, `
domain: each
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100}
`), Store: rec})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "each"}
	for i := range 2000 {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "t" + strconv.Itoa(i)}}, NumRequestsAllowed: 1})
	}
	if err := st.Send(m); err != nil {
		t.Fatal(err)
	}
	answered := 0
	for answered < 2000 {
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		answered += len(resp.GetBucketAction())
	}
	if n := rec.Largest(); n == 0 || n > 128 {
		t.Errorf("the largest store call held %d keys, want 1 to 128", n)
	}
}

// TestBucketIDBytesAreBounded: bucket ids count their bytes against a
// stream's bound and all streams': past either a new bucket is refused
// and counted, and a stream's bytes come back when its buckets go.
func TestBucketIDBytesAreBounded(t *testing.T) {
	t.Parallel()
	conn, svc := serveService(t, rlqs.Options{Configs: load(t, fleetConfig), MaxIDBytes: 10 * 1000, MaxTotalIDBytes: 15 * 1000})
	client := rlqsv3.NewRateLimitQuotaServiceClient(conn)
	report := func(prefix string, n int) *rlqsv3.RateLimitQuotaUsageReports {
		m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "fleet"}
		for i := range n {
			// 6 + 994 bytes: 1,000 an id.
			m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
				BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": fmt.Sprintf("%s%03d%s", prefix, i, strings.Repeat("x", 990))}}})
		}
		return m
	}
	buckets := func() int {
		rec := httptest.NewRecorder()
		svc.DebugHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/rlqs", nil))
		var v struct {
			Buckets int `json:"buckets"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
			t.Fatal(err)
		}
		return v.Buckets
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first, err := client.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Send(report("a", 12)); err != nil {
		t.Fatal(err)
	}
	if resp, err := first.Recv(); err != nil || len(resp.GetBucketAction()) != 10 {
		t.Fatalf("a stream's 12 ids of 1,000 bytes under a bound of 10,000: answered %d (%v), want 10", len(resp.GetBucketAction()), err)
	}
	second, err := client.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Send(report("b", 8)); err != nil {
		t.Fatal(err)
	}
	if resp, err := second.Recv(); err != nil || len(resp.GetBucketAction()) != 5 {
		t.Fatalf("a second stream's 8 under all streams' 15,000: answered %d (%v), want 5", len(resp.GetBucketAction()), err)
	}
	if got := buckets(); got != 15 {
		t.Errorf("tracking %d buckets, want 15", got)
	}
	// The first stream goes: its bytes come back, and a third stream
	// takes 10.
	_ = first.CloseSend()
	waitFor(t, "the first stream's buckets to go", func() bool { return buckets() == 5 })
	third, err := client.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := third.Send(report("c", 12)); err != nil {
		t.Fatal(err)
	}
	if resp, err := third.Recv(); err != nil || len(resp.GetBucketAction()) != 10 {
		t.Errorf("after the first stream went, a third's 12: answered %d (%v), want 10", len(resp.GetBucketAction()), err)
	}
}
