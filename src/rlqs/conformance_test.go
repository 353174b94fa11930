package rlqs_test

import (
	"context"
	"fmt"
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
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/rlqs"
	"github.com/openrls/ratelimit/src/rlqs/rlqstest"
)

// conformanceConfig is the domain of Envoy's RLQS integration tests, with
// the bucket ids their matcher builds ({name: prod, environment, group}),
// and a rule of each kind under the environment.
const conformanceConfig = `
domain: cloud_12345_67890_rlqs
descriptors:
  - key: name
    value: prod
    descriptors:
      - key: environment
        value: staging
        descriptors:
          - key: group
            rate_limit: {unit: second, requests_per_unit: 5}
      - key: environment
        value: open
        descriptors:
          - key: group
            rate_limit: {unlimited: true}
      - key: environment
        value: closed
        descriptors:
          - key: group
            rate_limit: {unit: second, requests_per_unit: 0}
`

const conformanceDomain = "cloud_12345_67890_rlqs"

func bucketID(env, group string) map[string]string {
	return map[string]string{"name": "prod", "environment": env, "group": group}
}

// conformance is one sequence's world: a service (which can be stopped
// and started again on the same address) and the fake Envoys on it.
type conformance struct {
	t      *testing.T
	p      rlqstest.Profile
	o      rlqs.Options
	addr   string
	conn   *grpc.ClientConn
	stop   func()
	envoys []*rlqstest.Envoy
}

func newConformance(t *testing.T, p rlqstest.Profile, o rlqs.Options) *conformance {
	o.Configs = load(t, conformanceConfig)
	if o.Store == nil {
		o.Store = limiter.NewMemoryStore(limiter.MemoryOptions{})
	}
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	log.SetOutput(testWriter{t})
	o.Logger = log
	c := &conformance{t: t, p: p, o: o, addr: "127.0.0.1:0"}
	c.start()
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	c.conn = conn
	t.Cleanup(func() {
		for _, e := range c.envoys {
			checkActions(t, e)
			e.Stop()
		}
		conn.Close()
		if c.stop != nil {
			c.stop()
		}
	})
	return c
}

// start serves the service on c.addr (a new port the first time, then
// the same one again).
func (c *conformance) start() {
	c.t.Helper()
	lis, err := net.Listen("tcp", c.addr)
	if err != nil {
		c.t.Fatal(err)
	}
	c.addr = lis.Addr().String()
	svc := rlqs.New(c.o)
	gs := grpc.NewServer()
	rlqsv3.RegisterRateLimitQuotaServiceServer(gs, svc)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _ = gs.Serve(lis) }()
	go svc.Run(ctx)
	c.stop = func() { cancel(); gs.Stop() }
}

// down stops the service: its streams end, and new ones fail.
func (c *conformance) down() {
	c.stop()
	c.stop = nil
}

func (c *conformance) envoy(o rlqstest.Options) *rlqstest.Envoy {
	o.Conn, o.Domain, o.Profile = c.conn, conformanceDomain, c.p
	e := rlqstest.Start(o)
	c.envoys = append(c.envoys, e)
	return e
}

// assigned waits until the Envoy enforces an assignment on each id.
func assigned(t *testing.T, e *rlqstest.Envoy, ids ...map[string]string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("an assignment of each of %v", ids), func() bool {
		for _, id := range ids {
			if s, _ := e.Strategy(id); s == nil {
				return false
			}
		}
		return true
	})
}

// reportsWithAll counts the reports sent that carry every one of ids.
func reportsWithAll(e *rlqstest.Envoy, ids ...map[string]string) int {
	n := 0
	for _, m := range e.Sent() {
		has := map[string]bool{}
		for _, u := range m.GetBucketQuotaUsages() {
			has[fmt.Sprint(u.GetBucketId().GetBucket())] = true
		}
		all := true
		for _, id := range ids {
			all = all && has[fmt.Sprint(id)]
		}
		if all {
			n++
		}
	}
	return n
}

func blanket(s *typev3.RateLimitStrategy) typev3.RateLimitStrategy_BlanketRule {
	return s.GetBlanketRule()
}

// The sequences of Envoy 1.40's RLQS integration tests
// (test/extensions/filters/http/rate_limit_quota/integration_test.cc),
// numbered as docs/rlqs.md lists them: what each asks of a server, driven
// through the fake Envoy against this one. Four ask nothing of a server
// (skip says why); five (3, 4, 19, 20, 21) check that Envoy ignores what
// a server should not send, and TestEnvoySequences checks that this one
// never sends it, across every sequence.
var envoySequences = []struct {
	n    int
	name string
	run  func(t *testing.T, p rlqstest.Profile)
	skip string
}{
	{1, "StartFailed", nil, "no RLQS server is reachable: the filter's own no-assignment default"},
	{2, "BasicFlowEmptyResponse", func(t *testing.T, p rlqstest.Profile) {
		// No report tick within the test: only the initial report can
		// bring the assignment.
		c := newConformance(t, p, rlqs.Options{})
		e := c.envoy(rlqstest.Options{Report: time.Hour})
		if !e.Request(bucketID("staging", "a")) {
			t.Error("the first request, before any assignment, was denied under the ALLOW_ALL default")
		}
		assigned(t, e, bucketID("staging", "a"))
		if n := len(e.Sent()); n != 1 {
			t.Errorf("%d reports sent, want the initial one only", n)
		}
	}, ""},
	{3, "BasicFlowResponseNotMatched", nil, "the server answers an unknown bucket id: this one never does (checked over every sequence)"},
	{4, "BasicFlowResponseMatched", nil, "the server answers with no action: this one never does (checked over every sequence)"},
	{5, "TestBasicMetadataLogging", nil, "the bucket id in Envoy's dynamic metadata and access log"},
	{6, "TestBasicPreviewMetadataLogging", func(t *testing.T, p rlqstest.Profile) {
		// A preview bucket and the real one: two initial reports from one
		// request, each answered.
		c := newConformance(t, p, rlqs.Options{})
		e := c.envoy(rlqstest.Options{Report: time.Hour})
		preview, real := bucketID("open", "preview"), bucketID("staging", "real")
		e.Request(preview)
		e.Request(real)
		assigned(t, e, preview, real)
	}, ""},
	{7, "BasicFlowMultiSameRequest", func(t *testing.T, p rlqstest.Profile) {
		c := newConformance(t, p, rlqs.Options{})
		e := c.envoy(rlqstest.Options{Report: time.Hour})
		id := bucketID("open", "same")
		for i := range 3 {
			if !e.Request(id) {
				t.Errorf("request %d on an unlimited rule denied", i+1)
			}
		}
		assigned(t, e, id)
		if s, _ := e.Strategy(id); blanket(s) != typev3.RateLimitStrategy_ALLOW_ALL {
			t.Errorf("an unlimited rule assigned %v, want ALLOW_ALL", s)
		}
		if n := len(e.Sent()); n != 1 {
			t.Errorf("%d reports sent for three requests on one bucket, want 1", n)
		}
	}, ""},
	{8, "BasicFlowMultiDifferentRequest", func(t *testing.T, p rlqstest.Profile) {
		c := newConformance(t, p, rlqs.Options{})
		e := c.envoy(rlqstest.Options{Report: 500 * time.Millisecond})
		ids := []map[string]string{bucketID("staging", "x"), bucketID("staging", "y"), bucketID("open", "z")}
		for _, id := range ids {
			e.Request(id)
		}
		assigned(t, e, ids...)
		waitFor(t, "a periodic report with all three buckets", func() bool { return reportsWithAll(e, ids...) > 0 })
	}, ""},
	{9, "MultiSameRequestNoAssignmentDenyAll", func(t *testing.T, p rlqstest.Profile) {
		// The initial report says 0 allowed, 1 denied: a bucket that asks
		// with nothing admitted yet still gets a share.
		c := newConformance(t, p, rlqs.Options{})
		e := c.envoy(rlqstest.Options{Report: time.Hour, NoAssignment: rlqstest.Deny})
		id := bucketID("staging", "deny")
		if e.Request(id) {
			t.Fatal("the first request was allowed under the DENY_ALL default")
		}
		assigned(t, e, id)
		if !e.Request(id) {
			t.Error("a request after the assignment was denied")
		}
	}, ""},
	{10, "MultiSameRequestNoAssignmentDenyAllWithSettings", nil, "the deny response Envoy builds (status, headers, body)"},
	{11, "MultiDifferentRequestNoAssignementAllowAll", func(t *testing.T, p rlqstest.Profile) {
		c := newConformance(t, p, rlqs.Options{})
		e := c.envoy(rlqstest.Options{Report: 500 * time.Millisecond})
		var ids []map[string]string
		for i := range 10 {
			ids = append(ids, bucketID("staging", fmt.Sprint("g", i)))
			e.Request(ids[i])
		}
		assigned(t, e, ids...)
		waitFor(t, "a periodic report with all ten buckets", func() bool { return reportsWithAll(e, ids...) > 0 })
	}, ""},
	{12, "MultiSameRequestAllowAllPreviewDenyAll", nil, "which of two preview matchers Envoy records"},
	{13, "MultiDifferentRequestNoAssignmentDenyAll", func(t *testing.T, p rlqstest.Profile) {
		c := newConformance(t, p, rlqs.Options{})
		e := c.envoy(rlqstest.Options{Report: 500 * time.Millisecond, NoAssignment: rlqstest.Deny})
		var ids []map[string]string
		for i := range 5 {
			ids = append(ids, bucketID("staging", fmt.Sprint("d", i)))
			if e.Request(ids[i]) {
				t.Errorf("bucket %d: the first request was allowed under the DENY_ALL default", i)
			}
		}
		assigned(t, e, ids...)
		for i, id := range ids {
			if !e.Request(id) {
				t.Errorf("bucket %d: a request after the assignment was denied", i)
			}
		}
	}, ""},
	{14, "BasicFlowPeriodicalReport", func(t *testing.T, p rlqstest.Profile) {
		// Ten report ticks with more requests each: the assignment never
		// lapses (ten ticks outlast the 4 s TTL: renewals keep it).
		c := newConformance(t, p, rlqs.Options{})
		e := c.envoy(rlqstest.Options{Report: 500 * time.Millisecond})
		id := bucketID("open", "periodic")
		e.Request(id)
		assigned(t, e, id)
		for i := range 10 {
			before := len(e.Sent())
			waitFor(t, "the next report", func() bool { return len(e.Sent()) > before })
			for range i + 1 {
				if !e.Request(id) {
					t.Fatalf("tick %d: a request on an unlimited rule denied", i+1)
				}
			}
		}
		if n := e.Expiries(); n != 0 {
			t.Errorf("%d assignments expired over ten ticks, want none: renewals must come before the TTL", n)
		}
	}, ""},
	{15, "BasicFlowPeriodicalReportWithStreamClosed", func(t *testing.T, p rlqstest.Profile) {
		// The stream breaks at the third tick; the Envoy opens another on
		// the next, re-reports, and is answered before its assignment
		// lapses.
		c := newConformance(t, p, rlqs.Options{})
		e := c.envoy(rlqstest.Options{Report: 500 * time.Millisecond})
		id := bucketID("staging", "reconnect")
		e.Request(id)
		assigned(t, e, id)
		waitFor(t, "three reports", func() bool { return len(e.Sent()) >= 4 })
		e.Break()
		before := len(e.Actions())
		waitFor(t, "a second stream, answered", func() bool { return e.Streams() == 2 && len(e.Actions()) > before })
		if n := e.Expiries(); n != 0 {
			t.Errorf("%d assignments expired across the reconnect, want none", n)
		}
	}, ""},
	{16, "MultiRequestWithTokenBucketThrottling", func(t *testing.T, p rlqstest.Profile) {
		// A token bucket throttles: asked 20 a second against 5, never
		// more than 5 admitted in a second, and some.
		var adm rlqstest.Admissions
		c := newConformance(t, p, rlqs.Options{})
		e := c.envoy(rlqstest.Options{Report: time.Second, NoAssignment: rlqstest.Deny, OnAdmit: adm.Add})
		id := bucketID("staging", "throttled")
		e.Request(id)
		assigned(t, e, id)
		if s, _ := e.Strategy(id); s.GetTokenBucket() == nil {
			t.Fatalf("a limited rule assigned %v, want a token bucket", s)
		}
		if n := drive(e, id, 20, 4*time.Second); n == 0 {
			t.Error("no request admitted in 4 s against a limit of 5 a second")
		}
		for sec, n := range adm.Snapshot() {
			if n > 5 {
				t.Errorf("second %d admitted %d, past the limit of 5", sec, n)
			}
		}
	}, ""},
	{17, "MultiRequestWithTokenBucketExpiration", func(t *testing.T, p rlqstest.Profile) {
		// The service goes away: the token bucket expires after its TTL to
		// the Envoy's fallback token bucket, and that to the default.
		c := newConformance(t, p, rlqs.Options{})
		fallback := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens: 6, TokensPerFill: wrapU32(1), FillInterval: durationpb.New(30 * time.Second)}}}
		e := c.envoy(rlqstest.Options{Report: 500 * time.Millisecond, Expired: fallback, ExpiredFor: 2 * time.Second})
		id := bucketID("staging", "expiring")
		e.Request(id)
		assigned(t, e, id)
		c.down()
		waitFor(t, "the assignment to expire to the fallback", func() bool { s, _ := e.Strategy(id); return s == fallback })
		waitFor(t, "the fallback to end", func() bool { s, _ := e.Strategy(id); return s == nil })
	}, ""},
	{18, "MultiRequestWithTokenBucketReplacement", func(t *testing.T, p rlqstest.Profile) {
		// Demand grows: the token bucket is replaced by a larger one (the
		// Envoy rescales its tokens), and no second admits past the limit
		// across the replacement.
		var adm rlqstest.Admissions
		c := newConformance(t, p, rlqs.Options{})
		e := c.envoy(rlqstest.Options{Report: time.Second, NoAssignment: rlqstest.Deny, OnAdmit: adm.Add})
		id := bucketID("staging", "replaced")
		drive(e, id, 1, 4*time.Second)
		drive(e, id, 8, 8*time.Second)
		grants := map[uint32]bool{}
		for _, a := range e.Actions() {
			if tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb != nil {
				grants[tb.GetTokensPerFill().GetValue()] = true
			}
		}
		if len(grants) < 2 {
			t.Errorf("demand went from 1 to 8 a second, and the token bucket was never replaced (tokens_per_fill sent: %v)", grants)
		}
		for sec, n := range adm.Snapshot() {
			if n > 5 {
				t.Errorf("second %d admitted %d, past the limit of 5", sec, n)
			}
		}
	}, ""},
	{19, "MultiRequestWithUnsupportedStrategy", nil, "the server sends RequestsPerTimeUnit: this one never does (checked over every sequence)"},
	{20, "MultiRequestWithUnsetStrategy", nil, "the server sends no strategy: this one never does (checked over every sequence)"},
	{21, "MultiRequestWithUnsupportedDefaultAction", nil, "RequestsPerTimeUnit as Envoy's own default; this server never sends it (checked over every sequence)"},
	{22, "MultiSameRequestWithExpiredAssignmentDeny", func(t *testing.T, p rlqstest.Profile) {
		c := newConformance(t, p, rlqs.Options{})
		e := c.envoy(rlqstest.Options{Report: 500 * time.Millisecond, Expired: rlqstest.Deny, ExpiredFor: time.Hour})
		id := bucketID("open", "expired-deny")
		e.Request(id)
		assigned(t, e, id)
		c.down()
		waitFor(t, "the assignment to expire to the DENY_ALL fallback", func() bool { s, _ := e.Strategy(id); return s == rlqstest.Deny })
		if e.Request(id) {
			t.Error("a request under the DENY_ALL fallback was allowed")
		}
	}, ""},
	{23, "MultiSameRequestWithExpiredAssignmentAllow", func(t *testing.T, p rlqstest.Profile) {
		// Expired to an ALLOW_ALL fallback while the service was away;
		// when it is back, the Envoy reconnects on its tick, re-reports
		// the bucket it still holds (no new initial report), and is
		// assigned again.
		c := newConformance(t, p, rlqs.Options{})
		e := c.envoy(rlqstest.Options{Report: 500 * time.Millisecond, NoAssignment: rlqstest.Deny, Expired: rlqstest.Allow, ExpiredFor: time.Hour})
		id := bucketID("staging", "expired-allow")
		e.Request(id)
		assigned(t, e, id)
		c.down()
		waitFor(t, "the assignment to expire to the ALLOW_ALL fallback", func() bool { s, _ := e.Strategy(id); return s == rlqstest.Allow })
		c.start()
		waitFor(t, "a token bucket again", func() bool { s, _ := e.Strategy(id); return s.GetTokenBucket() != nil })
	}, ""},
	{24, "MultiSameRequestWithExpirationToDefaultDeny", func(t *testing.T, p rlqstest.Profile) {
		// A DENY_ALL assignment (a limit of 0) expires to the DENY_ALL
		// fallback, and that to the ALLOW_ALL default.
		c := newConformance(t, p, rlqs.Options{})
		e := c.envoy(rlqstest.Options{Report: 500 * time.Millisecond, Expired: rlqstest.Deny, ExpiredFor: 2 * time.Second})
		id := bucketID("closed", "to-default")
		e.Request(id)
		assigned(t, e, id)
		if s, _ := e.Strategy(id); blanket(s) != typev3.RateLimitStrategy_DENY_ALL {
			t.Fatalf("a limit of 0 assigned %v, want DENY_ALL", s)
		}
		c.down()
		waitFor(t, "the fallback", func() bool { s, _ := e.Strategy(id); return s == rlqstest.Deny })
		waitFor(t, "the default", func() bool { s, _ := e.Strategy(id); return s == nil })
		if !e.Request(id) {
			t.Error("a request under the ALLOW_ALL default was denied")
		}
	}, ""},
	{25, "MultiSameRequestWithExpirationWithoutFallback", func(t *testing.T, p rlqstest.Profile) {
		c := newConformance(t, p, rlqs.Options{})
		e := c.envoy(rlqstest.Options{Report: 500 * time.Millisecond})
		id := bucketID("closed", "no-fallback")
		e.Request(id)
		assigned(t, e, id)
		c.down()
		waitFor(t, "the assignment to expire to the default", func() bool { s, held := e.Strategy(id); return s == nil && held })
	}, ""},
	{26, "MultiSameRequestWithAbandonAction", func(t *testing.T, p rlqstest.Profile) {
		// An idle bucket is abandoned: the reports after it are empty, and
		// a new request makes the bucket anew, with an initial report that
		// is answered.
		c := newConformance(t, p, rlqs.Options{Idle: 2 * time.Second})
		e := c.envoy(rlqstest.Options{Report: 500 * time.Millisecond})
		id := bucketID("staging", "abandoned")
		e.Request(id)
		assigned(t, e, id)
		waitFor(t, "the bucket to be abandoned", func() bool { _, held := e.Strategy(id); return !held })
		sent := len(e.Sent())
		waitFor(t, "a report after the abandon", func() bool { return len(e.Sent()) > sent })
		if m := e.Sent()[sent]; len(m.GetBucketQuotaUsages()) != 0 {
			t.Errorf("the report after an abandon carries %v, want none", m.GetBucketQuotaUsages())
		}
		e.Request(id)
		assigned(t, e, id)
	}, ""},
}

// TestEnvoySequences runs Envoy's integration-test sequences against the
// service through the fake Envoy, as Envoy 1.40 behaves and as the API's
// text describes a client (so the service depends on no quirk of 1.40 it
// need not); each also checks every action the service sent
// (checkActions).
//
// The sequences wait on real time (report ticks, TTLs), not on the CPU,
// so they run all at once: as subtests started from goroutines, which
// -parallel (the number of CPUs by default) does not hold back.
func TestEnvoySequences(t *testing.T) {
	t.Parallel()
	var all sync.WaitGroup
	for _, s := range envoySequences {
		all.Add(1)
		go func() {
			defer all.Done()
			t.Run(fmt.Sprintf("%02d_%s", s.n, s.name), func(t *testing.T) {
				if s.run == nil {
					t.Skip("asks nothing of a server: " + s.skip)
				}
				var both sync.WaitGroup
				for _, p := range []struct {
					name string
					p    rlqstest.Profile
				}{{"Envoy140", rlqstest.Envoy140}, {"API", rlqstest.API}} {
					both.Add(1)
					go func() {
						defer both.Done()
						t.Run(p.name, func(t *testing.T) { s.run(t, p.p) })
					}()
				}
				both.Wait()
			})
		}()
	}
	all.Wait()
}

// checkActions checks what e was sent: every action names a bucket e
// holds (Envoy skips others), and assigns only what Envoy 1.40 enforces:
// a blanket rule or a token bucket (not RequestsPerTimeUnit, not none),
// with a TTL of whole seconds, at least one (unset expires at once); a
// token bucket with tokens_per_fill set and a fill interval of at least
// a whole second (Envoy refills over its whole seconds).
func checkActions(t *testing.T, e *rlqstest.Envoy) {
	t.Helper()
	if n := e.Skipped(); n > 0 {
		t.Errorf("%d actions named a bucket the Envoy does not hold", n)
	}
	for _, a := range e.Actions() {
		if a.GetAbandonAction() != nil {
			continue
		}
		qa := a.GetQuotaAssignmentAction()
		if qa == nil {
			t.Errorf("an action with neither an assignment nor an abandon: %v", a)
			continue
		}
		if ttl := qa.GetAssignmentTimeToLive(); ttl.GetSeconds() < 1 || ttl.GetNanos() != 0 {
			t.Errorf("TTL %v, want whole seconds, at least 1: %v", ttl, a)
		}
		switch st := qa.GetRateLimitStrategy(); st.GetStrategy().(type) {
		case *typev3.RateLimitStrategy_BlanketRule_:
		case *typev3.RateLimitStrategy_TokenBucket:
			tb := st.GetTokenBucket()
			if tb.GetMaxTokens() < 1 || tb.GetTokensPerFill().GetValue() < 1 {
				t.Errorf("a token bucket without tokens: %v", a)
			}
			// Envoy reads the whole seconds (the rate), and the nanoseconds
			// only to compare token buckets; a client that reads both
			// refills slower, never faster.
			if fi := tb.GetFillInterval(); fi.GetSeconds() < 1 || fi.GetNanos() < 0 {
				t.Errorf("fill interval %v, want at least a whole second: %v", fi, a)
			}
		default:
			t.Errorf("a strategy Envoy 1.40 does not enforce: %v", a)
		}
	}
}

func wrapU32(v uint32) *wrapperspb.UInt32Value { return wrapperspb.UInt32(v) }
