package tracing

import (
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/service"
)

func TestSpanTree(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr, err := Setup(context.Background(), Options{Enabled: true, ServiceName: "rl-test", SamplingRate: 1, Exporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	f, err := config.Parse("t.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Build([]*config.File{f}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var cur atomic.Pointer[config.Config]
	cur.Store(cfg)
	mem := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
	defer mem.Close()
	log := logrus.New()
	log.SetOutput(io.Discard)
	svc, err := service.New(service.Options{Store: tr.Store(mem), Configs: &cur, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(tr.ServerOptions()...)
	rlsv3.RegisterRateLimitServiceServer(gs, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d",
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	// The server span ends when gRPC's stats handler sees the call end,
	// which can be just after the client has its answer: flush until it is
	// there, within a bound. Flush, not Shutdown: the in-memory exporter
	// forgets spans on shutdown.
	var spans tracetest.SpanStubs
	for deadline := time.Now().Add(5 * time.Second); ; {
		if err := tr.provider.ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
		if spans = exp.GetSpans(); len(spans) >= 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond) // polling the exporter
	}
	if len(spans) != 2 {
		t.Fatalf("got %d spans, want 2 (the call and its store round trip): %v", len(spans), spans)
	}
	store, call := spans[0], spans[1]
	if store.Name != "ratelimit.store.apply" || call.Name != "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" {
		t.Errorf("span names = %q, %q", store.Name, call.Name)
	}
	if call.SpanContext.TraceID().String() != traceID || call.Parent.SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("call span is not a child of the caller's traceparent: trace %s parent %s", call.SpanContext.TraceID(), call.Parent.SpanID())
	}
	if store.Parent.SpanID() != call.SpanContext.SpanID() || store.SpanContext.TraceID().String() != traceID {
		t.Errorf("store span's parent = %s, want the call span %s", store.Parent.SpanID(), call.SpanContext.SpanID())
	}
}

func TestDisabledAddsNothing(t *testing.T) {
	tr, err := Setup(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	mem := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
	defer mem.Close()
	if tr.Store(mem) != limiter.Store(mem) || len(tr.ServerOptions()) != 0 {
		t.Error("disabled tracing wrapped the store or the server")
	}
}
