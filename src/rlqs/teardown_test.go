package rlqs_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/rlqs"
)

// gateStore holds the first count of grants (not the demand exchange)
// after it is armed until released; panicking makes every Apply panic.
type gateStore struct {
	limiter.Store
	armed, panicking atomic.Bool
	entered, release chan struct{}
}

func (g *gateStore) Apply(ctx context.Context, b limiter.Batch) ([]limiter.Outcome, error) {
	if g.panicking.Load() {
		panic("gateStore: a store that panics")
	}
	if countsGrants(b) && g.armed.CompareAndSwap(true, false) {
		close(g.entered)
		<-g.release
	}
	return g.Store.Apply(ctx, b)
}

// countsGrants reports whether b counts grants: not the demand exchange's
// counters, not refunds.
func countsGrants(b limiter.Batch) bool {
	return len(b.Hits) > 0 && !b.Hits[0].Refund && !strings.HasSuffix(b.Hits[0].Key, "rlqs-demand")
}

// gauge reads one of svc's series.
func gauge(t *testing.T, svc *rlqs.Service, name string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(svc.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no series %s", name)
	return 0
}

// reportOnce opens a stream, reports one bucket of tenant a and waits for
// its assignment.
func reportOnce(t *testing.T, ctx context.Context, conn *grpc.ClientConn) (grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse], error) {
	t.Helper()
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "fleet", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "a"}}, TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 20}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Recv()
	return st, err
}

// A stream that closes while a grant round counts in the store (the round
// holds no lock while the store works) empties its
// buckets' members under the round: the round must finish on what it
// planned, not index what is gone (it crashed the process: index out of
// range in reserve). Run under -race by make check.
func TestStreamClosingDuringARound(t *testing.T) {
	g := &gateStore{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), entered: make(chan struct{}), release: make(chan struct{})}
	conn, svc := serveService(t, rlqs.Options{Configs: load(t, fleetConfig), Store: g})
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := reportOnce(t, ctx, conn); err != nil {
		t.Fatal(err)
	}
	g.armed.Store(true) // the next round's check (renewals run every second)
	select {
	case <-g.entered:
	case <-time.After(time.Minute):
		t.Fatal("no grant round checked the store within a minute")
	}
	cancel() // the Envoy goes away mid-round
	waitFor(t, "the stream closed and its bucket dropped", func() bool { return gauge(t, svc, "ratelimit_rlqs_buckets") == 0 })
	close(g.release)
	// The service goes on: a new stream is served, and nothing panicked.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	if _, err := reportOnce(t, ctx2, conn); err != nil {
		t.Fatalf("after the round: %v", err)
	}
	if n := gauge(t, svc, "ratelimit_rlqs_panics_total"); n != 0 {
		t.Errorf("%v panics recovered, want none", n)
	}
}

// A panic in a stream's work (here the store's) ends that stream with
// Internal, is counted, and the process serves on: the next stream, once
// the store behaves, gets its assignment.
func TestPanicEndsTheStreamNotTheProcess(t *testing.T) {
	g := &gateStore{Store: limiter.NewMemoryStore(limiter.MemoryOptions{})}
	conn, svc := serveService(t, rlqs.Options{Configs: load(t, fleetConfig), Store: g})
	panicEndsTheStream(t, conn, svc, &g.panicking)
}

// panicEndsTheStream sets panicking, has a stream's first round panic and
// checks that it ended that stream with Internal, counted, and that once
// panicking is cleared the next stream gets its assignment.
func panicEndsTheStream(t *testing.T, conn *grpc.ClientConn, svc *rlqs.Service, panicking *atomic.Bool) {
	t.Helper()
	panicking.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := reportOnce(t, ctx, conn); status.Code(err) != codes.Internal {
		t.Fatalf("the stream whose round panicked: %v, want Internal", err)
	}
	if n := gauge(t, svc, "ratelimit_rlqs_panics_total"); n < 1 {
		t.Errorf("panics counted %v, want at least 1", n)
	}
	panicking.Store(false)
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	if _, err := reportOnce(t, ctx2, conn); err != nil {
		t.Fatalf("the next stream: %v", err)
	}
}

// panickyConfigs is a config holder whose Load panics while panicking is
// set: the round's planning, on the service's owner, reads the config.
type panickyConfigs struct {
	holder
	panicking atomic.Bool
}

func (p *panickyConfigs) Load() *config.Config {
	if p.panicking.Load() {
		panic("panickyConfigs: a config that panics")
	}
	return p.holder.Load()
}

// A panic on the service's owner (here in planning a round at once) ends
// the stream the round served with Internal, is counted, and the owner
// serves on: the next stream gets its assignment.
func TestAPanicOnTheOwnerEndsTheStreamNotTheService(t *testing.T) {
	cfgs := &panickyConfigs{holder: load(t, fleetConfig)}
	conn, svc := serveService(t, rlqs.Options{Configs: cfgs})
	panicEndsTheStream(t, conn, svc, &cfgs.panicking)
}
