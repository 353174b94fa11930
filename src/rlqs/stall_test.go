package rlqs_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openrls/ratelimit/src/rlqs"
	"github.com/openrls/ratelimit/src/rlqs/rlqstest"
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
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, closeConn, err := rlqstest.Stall(ctx, conn.Target(), "fleet", "user")
	if err != nil {
		t.Fatal(err)
	}
	defer closeConn()
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
