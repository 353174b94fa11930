package rlqs_test

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/rlqs"
	"github.com/openrls/ratelimit/src/rlqs/rlqstest"
)

const fleetConfig = `
domain: fleet
descriptors:
  - key: tenant
    value: a
    rate_limit: {unit: second, requests_per_unit: 30}
  - key: tenant
    value: free
    rate_limit: {unlimited: true}
  - key: tenant
    value: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: tenant
    value: trial
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: tenant
    value: exports
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: concurrency}
`

type holder struct{ cfg *config.Config }

func (h holder) Load() *config.Config { return h.cfg }

func load(t *testing.T, yaml string) holder {
	t.Helper()
	f, err := config.Parse("rlqs.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Build([]*config.File{f}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return holder{cfg}
}

// serve runs a Service on a loopback port and returns a connection to it.
func serve(t *testing.T, o rlqs.Options) *grpc.ClientConn {
	conn, _ := serveService(t, o)
	return conn
}

// serveService is serve, also returning the Service.
func serveService(t *testing.T, o rlqs.Options) (*grpc.ClientConn, *rlqs.Service) {
	t.Helper()
	if o.Store == nil {
		o.Store = limiter.NewMemoryStore(limiter.MemoryOptions{})
	}
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	log.SetOutput(testWriter{t})
	o.Logger = log
	svc := rlqs.New(o)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rlqsv3.RegisterRateLimitQuotaServiceServer(gs, svc)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _ = gs.Serve(lis) }()
	go svc.Run(ctx)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		conn.Close()
		gs.Stop()
	})
	return conn, svc
}

// drive sends rate requests per second on id for d, paced, and returns
// how many were allowed.
func drive(e *rlqstest.Envoy, id map[string]string, rate int, d time.Duration) int {
	t := time.NewTicker(time.Second / time.Duration(rate))
	defer t.Stop()
	end := time.Now().Add(d)
	allowed := 0
	for n := 0; n < rate*int(d/time.Second)+rate; n++ {
		now := <-t.C
		if now.After(end) {
			break
		}
		if e.Request(id) {
			allowed++
		}
	}
	return allowed
}

func TestFleetSharesOneLimitExactly(t *testing.T) {
	t.Parallel()
	conn := serve(t, rlqs.Options{Configs: load(t, fleetConfig)})
	var adm rlqstest.Admissions
	id := map[string]string{"tenant": "a"}
	var wg sync.WaitGroup
	start := time.Now()
	const run = 14 * time.Second
	for _, demand := range []int{20, 20, 5} {
		e := rlqstest.Start(rlqstest.Options{Conn: conn, Domain: "fleet", Report: time.Second,
			NoAssignment: rlqstest.Deny, OnAdmit: adm.Add})
		defer e.Stop()
		wg.Add(1)
		go func() { defer wg.Done(); drive(e, id, demand, run) }()
	}
	wg.Wait()
	per := adm.Snapshot()
	settled, seconds := 0, 0
	for sec, n := range per {
		if n > 30 {
			t.Errorf("second %d admitted %d across the fleet, past the limit of 30 (all: %v)", sec-start.Unix(), n, per)
		}
	}
	// Shares settle within a TTL and a delivery bound of each Envoy's
	// first measured report; count from 8 s to the last whole second.
	for sec := start.Unix() + 8; sec < start.Add(run).Unix(); sec++ {
		settled += per[sec]
		seconds++
	}
	// A figure, not a rule: 68-71% measured here quiet (BenchmarkRLQS
	// measures it); the test holds only that shares are granted at all.
	if settled < 10*seconds {
		t.Errorf("settled seconds admitted %d in %d s, under a third of 30 per second: shares are not being granted (all: %v)", settled, seconds, per)
	}
	t.Logf("settled utilisation: %.0f%% of the limit (per second: %v)", 100*float64(settled)/float64(30*seconds), per)
}

// TestBucketKinds checks what each kind of rule is answered, and that
// what Envoy 1.40 sends against the API's rules (an empty report, an
// empty bucket id, time_elapsed 0, the domain on every message) never
// closes the stream.
func TestBucketKinds(t *testing.T) {
	conn := serve(t, rlqs.Options{Configs: load(t, fleetConfig)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	report := func(ids ...map[string]string) {
		t.Helper()
		m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "fleet"}
		for _, id := range ids {
			m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
				BucketId: &rlqsv3.BucketId{Bucket: id}, TimeElapsed: durationpb.New(0), NumRequestsAllowed: 1})
		}
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	report()                    // empty report
	report(map[string]string{}) // empty bucket id
	for _, tc := range []struct {
		id   map[string]string
		want string
	}{
		{map[string]string{"tenant": "free"}, "ALLOW_ALL"},
		{map[string]string{"tenant": "nobody"}, "ALLOW_ALL"},
		{map[string]string{"tenant": "trial"}, "ALLOW_ALL"},
		{map[string]string{"tenant": "blocked"}, "DENY_ALL"},
		// An RLQS client reports no stream ends: work in flight is not
		// counted here.
		{map[string]string{"tenant": "exports"}, "ALLOW_ALL"},
		{map[string]string{"tenant": "a"}, "token_bucket"},
	} {
		report(tc.id)
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("%v: stream closed: %v", tc.id, err)
		}
		got := resp.GetBucketAction()
		if len(got) != 1 || got[0].GetBucketId().GetBucket()["tenant"] != tc.id["tenant"] {
			t.Fatalf("%v: answered %v", tc.id, got)
		}
		qa := got[0].GetQuotaAssignmentAction()
		if s := qa.GetAssignmentTimeToLive(); s.GetSeconds() < 1 || s.GetNanos() != 0 {
			t.Errorf("%v: TTL %v, want whole seconds, at least 1", tc.id, s)
		}
		strat := qa.GetRateLimitStrategy()
		kind := strat.GetBlanketRule().String()
		if tb := strat.GetTokenBucket(); tb != nil {
			kind = "token_bucket"
			if tb.GetTokensPerFill() == nil || tb.GetFillInterval().GetNanos() != 1 || tb.GetFillInterval().GetSeconds() < 1 || tb.GetMaxTokens() != 2 {
				t.Errorf("%v: token bucket %v: want capacity 2, tokens_per_fill set, whole seconds of fill interval and a nanosecond naming the 1 s period", tc.id, tb)
			}
		} else if _, ok := strat.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_); !ok {
			t.Errorf("%v: strategy %v, want a blanket rule or a token bucket", tc.id, strat)
		}
		if kind != tc.want {
			t.Errorf("%v: %s, want %s", tc.id, kind, tc.want)
		}
	}
	// The Envoy closes its side: the stream ends cleanly (OK, not an error
	// status), after whatever renewals were on their way.
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for n := 0; ; n++ {
		_, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil || n > 1000 {
			t.Fatalf("after CloseSend: %v, want the stream to end with OK", err)
		}
	}
}

// TestIdleBucketsAreAbandoned: a bucket that reports no requests for the
// idle time is abandoned, and the Envoy forgets it; a request after that
// makes the bucket anew (a new initial report), and it is assigned again.
func TestIdleBucketsAreAbandoned(t *testing.T) {
	t.Parallel()
	conn := serve(t, rlqs.Options{Configs: load(t, fleetConfig), Idle: 2 * time.Second})
	e := rlqstest.Start(rlqstest.Options{Conn: conn, Domain: "fleet", Report: time.Second, NoAssignment: rlqstest.Deny})
	defer e.Stop()
	id := map[string]string{"tenant": "a"}
	e.Request(id)
	abandoned := func() int {
		for i, a := range e.Actions() {
			if a.GetAbandonAction() != nil {
				return i
			}
		}
		return -1
	}
	waitFor(t, "an idle bucket to be abandoned", func() bool { return abandoned() >= 0 })
	waitFor(t, "the Envoy to drop the bucket", func() bool { _, held := e.Strategy(id); return !held })
	e.Request(id)
	// Assigned in the Envoy, not only sent: an action for a bucket the
	// Envoy no longer holds is skipped.
	assigned(t, e, id)
	if n := e.Skipped(); n > 0 {
		t.Errorf("%d actions named a bucket the Envoy had dropped", n)
	}
}

// TestAReportOnItsWayWhenABucketIsAbandoned: a report that crossed the
// abandon (the bucket idle in it) does not make the bucket anew, since
// the Envoy dropped it; a report with requests does (the Envoy made it
// anew), and is answered at once.
func TestAReportOnItsWayWhenABucketIsAbandoned(t *testing.T) {
	t.Parallel()
	conn := serve(t, rlqs.Options{Configs: load(t, fleetConfig), Idle: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	report := func(tenant string, allowed uint64) {
		t.Helper()
		if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "fleet", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": tenant}}, TimeElapsed: durationpb.New(0), NumRequestsAllowed: allowed}}}); err != nil {
			t.Fatal(err)
		}
	}
	// recv returns the next message's actions by tenant.
	recv := func() map[string]*rlqsv3.RateLimitQuotaResponse_BucketAction {
		t.Helper()
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]*rlqsv3.RateLimitQuotaResponse_BucketAction{}
		for _, a := range m.GetBucketAction() {
			got[a.GetBucketId().GetBucket()["tenant"]] = a
		}
		return got
	}
	report("free", 1)
	for {
		if a := recv()["free"]; a.GetAbandonAction() != nil {
			break
		}
	}
	report("free", 0) // sent before the abandon arrived
	report("a", 1)    // a new bucket: answered at once
	for {
		got := recv()
		if a, ok := got["free"]; ok {
			t.Fatalf("an idle report that crossed the abandon was answered: %v", a)
		}
		if got["a"] != nil {
			break
		}
	}
	report("free", 1) // a request made the bucket anew
	for {
		if a := recv()["free"]; a != nil {
			if a.GetQuotaAssignmentAction() == nil {
				t.Fatalf("the bucket made anew was answered %v, want an assignment", a)
			}
			break
		}
	}
}

// TestEveryActionNamesABucketTheEnvoyHolds: five buckets on one Envoy,
// each answered at once on its initial report and renewed after; no
// action names a bucket id other than one the Envoy reported (Envoy
// ignores such an action, so the bucket would go unassigned).
func TestEveryActionNamesABucketTheEnvoyHolds(t *testing.T) {
	t.Parallel()
	conn := serve(t, rlqs.Options{Configs: load(t, fleetConfig)})
	e := rlqstest.Start(rlqstest.Options{Conn: conn, Domain: "fleet", Report: time.Second, NoAssignment: rlqstest.Deny})
	defer e.Stop()
	tenants := []string{"a", "free", "blocked", "trial", "nobody"}
	for _, tn := range tenants {
		e.Request(map[string]string{"tenant": tn})
	}
	waitFor(t, "every bucket to be assigned", func() bool {
		got := map[string]bool{}
		for _, a := range e.Actions() {
			got[a.GetBucketId().GetBucket()["tenant"]] = true
		}
		return len(got) == len(tenants)
	})
	if n := e.Skipped(); n > 0 {
		t.Errorf("%d actions named a bucket the Envoy does not hold", n)
	}
}

// waitFor polls cond for up to two minutes: a bound a busy machine does
// not reach, not a timing assertion.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testWriter sends the service's log to the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// TestAShareThatEndsIsDeniedBeforeItsTTL: with Envoy's default settings (no
// expired-assignment fallback, ALLOW_ALL before an assignment), a bucket
// whose share drops to nothing (its traffic stopped) is sent DENY_ALL
// before its token bucket's TTL ends: no assignment expires, so the Envoy
// never falls back to allowing everything, which nothing reserved.
func TestAShareThatEndsIsDeniedBeforeItsTTL(t *testing.T) {
	t.Parallel()
	conn, _ := serveService(t, rlqs.Options{Configs: load(t, fleetConfig)})
	e := rlqstest.Start(rlqstest.Options{Conn: conn, Domain: "fleet", Report: 2 * time.Second})
	defer e.Stop()
	id := map[string]string{"tenant": "a"}
	for range 3 {
		e.Request(id)
	}
	// Reports every 2 s: the second shows no traffic, the share drops to
	// nothing; the token bucket sent last would end 4 s (the TTL) after it.
	deadline := time.Now().Add(time.Minute)
	for {
		if st, _ := e.Strategy(id); st.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no DENY_ALL within a minute of the traffic stopping")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := e.Expiries(); n != 0 {
		t.Errorf("%d assignments expired before DENY_ALL replaced the token bucket, want none", n)
	}
}
