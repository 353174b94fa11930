package xds

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/metadata"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/reload"
)

func TestBackoffWait(t *testing.T) {
	b := Backoff{Initial: 10 * time.Second, Max: 60 * time.Second, RandomFactor: 0.5, Jitter: true}
	tests := []struct {
		attempt int
		rnd     float64
		want    time.Duration
	}{
		{1, 0.5, 10 * time.Second},
		{2, 0.5, 20 * time.Second},
		{3, 0.5, 40 * time.Second},
		{4, 0.5, 60 * time.Second},
		{9, 0.5, 60 * time.Second},
		{1, 0, 5 * time.Second},
		{1, 0.999999, 15 * time.Second},
	}
	for _, tc := range tests {
		if got := b.wait(tc.attempt, tc.rnd).Round(time.Millisecond); got != tc.want {
			t.Errorf("wait(%d, %v) = %v, want %v", tc.attempt, tc.rnd, got, tc.want)
		}
	}
	b.Jitter = false
	if got := b.wait(1, 0); got != 10*time.Second {
		t.Errorf("without jitter wait(1) = %v, want 10s", got)
	}
}

// TestRunSendsNodeMetadataAndHeaders: CONFIG_GRPC_XDS_NODE_METADATA reaches
// the server as the node's metadata, CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS
// as the stream's gRPC metadata; XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES refuses
// a larger response.
func TestRunSendsNodeMetadataAndHeaders(t *testing.T) {
	headers := make(chan metadata.MD, 16)
	nodes := make(chan *discoveryv3.DiscoveryRequest, 16)
	addr, cache := serveADS(t, serverv3.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, _ int64, _ string) error {
			md, _ := metadata.FromIncomingContext(ctx)
			headers <- md
			return nil
		},
		StreamRequestFunc: func(_ int64, req *discoveryv3.DiscoveryRequest) error {
			select {
			case nodes <- req:
			default:
			}
			return nil
		}})

	log := logrus.New()
	log.SetOutput(io.Discard)
	installed := make(chan error, 16)
	h := reload.NewHolder(func(_ *config.Config, err error) { installed <- err })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{ServerURL: addr, NodeID: "node-1", RetryInterval: 20 * time.Millisecond, Logger: log,
			Install: h.Install, NodeMetadata: map[string]string{"zone": "a"}, Headers: map[string]string{"x-token": "secret"},
			MaxMsgSize: 4096})
	}()
	defer func() { cancel(); <-done }()

	select {
	case md := <-headers:
		if got := md.Get("x-token"); len(got) != 1 || got[0] != "secret" {
			t.Errorf("stream metadata x-token = %q, want [secret]", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no stream opened")
	}
	select {
	case req := <-nodes:
		if got := req.GetNode().GetMetadata().GetFields()["zone"].GetStringValue(); got != "a" {
			t.Errorf("node metadata zone = %q, want a", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no request")
	}
	// A response past the size bound breaks the stream (the client
	// reconnects: a second stream opens) and never installs; a small one
	// then does.
	big := limitConfig(5, rlconfv3.RateLimitUnit_MINUTE)
	for i := range 1000 {
		big.Descriptors = append(big.Descriptors, &rlconfv3.RateLimitDescriptor{Key: "k", Value: fmt.Sprintf("value-%d", i),
			RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 1}})
	}
	setConfig(t, cache, "1", big)
	select {
	case <-headers:
	case err := <-installed:
		t.Fatalf("a response past XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES was handled (err %v)", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not break on a response past XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")
	}
	setConfig(t, cache, "2", limitConfig(5, rlconfv3.RateLimitUnit_MINUTE))
	select {
	case err := <-installed:
		if err != nil {
			t.Fatalf("small config rejected: %v", err)
		}
		if d := dump(h.Load()); strings.Contains(d, "value-1") {
			t.Fatalf("the big config was installed:\n%s", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("small config not installed")
	}
}
