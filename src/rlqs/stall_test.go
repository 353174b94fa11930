package rlqs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/openrls/ratelimit/src/rlqs"
)

// TestAStreamWhoseEnvoyDoesNotReadIsEnded: an Envoy that stops reading
// fills the transport's buffers, and a renewal's send blocks. When the
// delivery bound passes, the service ends the stream (Unavailable, and
// counted) rather than let the renewal leave late, and goes on serving
// others.
func TestAStreamWhoseEnvoyDoesNotReadIsEnded(t *testing.T) {
	conn, svc := serveService(t, rlqs.Options{
		Configs: load(t, "domain: fleet\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"),
		Push:    100 * time.Millisecond, TTL: time.Second, Delivery: 300 * time.Millisecond})
	// A connection with gRPC's smallest flow-control windows, not grown
	// by its estimates, as a peer that reads little.
	slow, err := grpc.NewClient(conn.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(slow).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Each renewal of these buckets is a message of over 100 KB: two are
	// past what the windows and the server's write quota let through.
	report := &rlqsv3.RateLimitQuotaUsageReports{Domain: "fleet"}
	for i := range 3000 {
		report.BucketQuotaUsages = append(report.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"user": fmt.Sprintf("user-%04d", i)}}, TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 5})
	}
	if err := st.Send(report); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stalled stream to be ended", func() bool { return gauge(t, svc, "ratelimit_rlqs_stalled_streams_total") == 1 })
	// Reading now drains what left before the stall, then the end.
	for {
		if _, err = st.Recv(); err != nil {
			break
		}
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("the stalled stream ended with %v, want Unavailable", err)
	}
	// Others are served.
	if _, err := reportOnce(t, context.Background(), conn); err != nil {
		t.Fatalf("another stream after the stall: %v", err)
	}
}
