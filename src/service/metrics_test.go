package service

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/openrls/ratelimit/src/metrics"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func scrape(t *testing.T, reg *metrics.Registry) string {
	t.Helper()
	rec := httptest.NewRecorder()
	reg.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

func series(body, prefix string) int {
	n := 0
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

func TestRuleMetrics(t *testing.T) {
	reg := metrics.New(metrics.Options{})
	s := newTestServer(t, Options{Metrics: reg})
	ctx := context.Background()
	for range 3 { // limit 2: ok, ok (near), over
		if _, err := s.ShouldRateLimit(ctx, req("web", d("ip=9"))); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 { // shadow limit 1: ok, over (shadowed)
		if _, err := s.ShouldRateLimit(ctx, req("web", d("shadow=1"))); err != nil {
			t.Fatal(err)
		}
	}
	body := scrape(t, reg)
	for _, want := range []string{
		`ratelimit_service_rate_limit_total_hits{domain="web",key="ip"} 3`,
		`ratelimit_service_rate_limit_within_limit{domain="web",key="ip"} 2`,
		`ratelimit_service_rate_limit_near_limit{domain="web",key="ip"} 1`,
		`ratelimit_service_rate_limit_over_limit{domain="web",key="ip"} 1`,
		`ratelimit_service_rate_limit_shadow_mode{domain="web",key="ip"} 0`,
		`ratelimit_service_rate_limit_total_hits{domain="web",key="shadow"} 2`,
		`ratelimit_service_rate_limit_over_limit{domain="web",key="shadow"} 1`,
		`ratelimit_service_rate_limit_shadow_mode{domain="web",key="shadow"} 1`,
		`ratelimit_requests_total{code="ok"} 4`,
		`ratelimit_requests_total{code="over_limit"} 1`,
		`ratelimit_backend_duration_seconds_count 5`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestMetricsCardinalityIsBounded(t *testing.T) {
	reg := metrics.New(metrics.Options{MaxDetailedSeries: 5})
	s := newTestServer(t, Options{Metrics: reg})
	ctx := context.Background()
	before := series(scrape(t, reg), "ratelimit_service_rate_limit_total_hits")
	for i := range 10_000 {
		v := fmt.Sprintf("v%d", i)
		o := d("ip=" + v)
		if i%2 == 0 {
			o.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE}
		}
		if _, err := s.ShouldRateLimit(ctx, req("web", o, d("unknown="+v), d("detailed="+v))); err != nil {
			t.Fatal(err)
		}
	}
	after := series(scrape(t, reg), "ratelimit_service_rate_limit_total_hits")
	// ip, ip._override, 5 detailed series and detailed's own path.
	if after-before > 8 {
		t.Errorf("10,000 distinct values added %d series, want at most 8", after-before)
	}
}

func TestResponseHeaders(t *testing.T) {
	tests := []struct {
		name  string
		desc  *rlv3.RateLimitDescriptor
		calls int
		want  string
	}{
		{"fixed window, ok", d("ip=h1"), 1, "RateLimit-Limit=2 RateLimit-Remaining=1 RateLimit-Reset=50"},
		{"fixed window, over", d("ip=h2"), 3, "RateLimit-Limit=2 RateLimit-Remaining=0 RateLimit-Reset=50 Retry-After=50"},
		{"token bucket", d("bucket=h"), 2, "RateLimit-Limit=4 RateLimit-Remaining=2 RateLimit-Reset=30"},
		{"sliding window", d("sliding=h"), 1, "RateLimit-Limit=3 RateLimit-Remaining=2 RateLimit-Reset=110"},
		{"multiplied window", d("windowed=h"), 1, "RateLimit-Limit=1, 1;w=30 RateLimit-Remaining=0 RateLimit-Reset=20"},
		{"no limit, no headers", d("nope=h"), 1, ""},
	}
	s := newTestServer(t, Options{Headers: Headers{Enabled: true}})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var resp *rlsv3.RateLimitResponse
			for range tc.calls {
				var err error
				if resp, err = s.ShouldRateLimit(context.Background(), req("web", tc.desc)); err != nil {
					t.Fatal(err)
				}
			}
			var got []string
			for _, h := range resp.GetResponseHeadersToAdd() {
				got = append(got, h.GetKey()+"="+h.GetValue())
			}
			if strings.Join(got, " ") != tc.want {
				t.Errorf("headers = %q, want %q", strings.Join(got, " "), tc.want)
			}
		})
	}
}

// TestResponseHeadersSeveralDescriptors: with several descriptors, the
// headers describe the one envoyproxy/ratelimit describes: the last that
// rejects the request, else the first with the fewest remaining (not the
// smallest share of its limit).
func TestResponseHeadersSeveralDescriptors(t *testing.T) {
	heavy := func(kv string, hits uint64) *rlv3.RateLimitDescriptor {
		x := d(kv)
		x.HitsAddend = wrapperspb.UInt64(hits)
		return x
	}
	tests := []struct {
		name  string
		descs []*rlv3.RateLimitDescriptor
		want  string
	}{
		// big: 40 of 100 left (40%); ip: 1 of 2 (50%): the fewest is ip's.
		{"fewest remaining", []*rlv3.RateLimitDescriptor{heavy("big=a", 60), d("ip=a")}, "RateLimit-Limit=2 RateLimit-Remaining=1 RateLimit-Reset=50"},
		// A tie: the first.
		{"tie", []*rlv3.RateLimitDescriptor{d("tagged=b"), d("tagged2=b")}, "RateLimit-Limit=5 RateLimit-Remaining=4 RateLimit-Reset=50"},
		// The last rejecting descriptor, though big has as few left.
		{"rejected", []*rlv3.RateLimitDescriptor{heavy("ip=c", 3), heavy("big=c", 100), heavy("windowed=c", 2)},
			"RateLimit-Limit=1, 1;w=30 RateLimit-Remaining=0 RateLimit-Reset=20 Retry-After=50"},
		// A quota-mode rejection is not the rejecting one: ip's, before it.
		{"quota", []*rlv3.RateLimitDescriptor{heavy("ip=d", 3), heavy("quota=d", 2)}, "RateLimit-Limit=2 RateLimit-Remaining=0 RateLimit-Reset=50 Retry-After=50"},
		// Every quota descriptor over: the request passes once one frees.
		{"quota only", []*rlv3.RateLimitDescriptor{heavy("big=e", 99), heavy("quota=e", 2)}, "RateLimit-Limit=1 RateLimit-Remaining=0 RateLimit-Reset=50 Retry-After=50"},
	}
	s := newTestServer(t, Options{Headers: Headers{Enabled: true}})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := s.ShouldRateLimit(context.Background(), req("web", tc.descs...))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, h := range resp.GetResponseHeadersToAdd() {
				got = append(got, h.GetKey()+"="+h.GetValue())
			}
			if strings.Join(got, " ") != tc.want {
				t.Errorf("headers = %q, want %q (%v)", strings.Join(got, " "), tc.want, resp)
			}
		})
	}
}

func TestDynamicMetadata(t *testing.T) {
	s := newTestServer(t, Options{DynamicMetadata: true})
	r := req("web", d("quota=m"), d("quota=m"), d("nope=x"), d("ip=1"), d("tagged=1"), d("tagged2=1"))
	r.HitsAddend = 1
	r.Descriptors[3].Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	resp, err := s.ShouldRateLimit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	got, err := protojson.Marshal(resp.GetDynamicMetadata())
	if err != nil {
		t.Fatal(err)
	}
	// The reference's fields (domain, descriptors with "key=value" entries,
	// limit as protobuf text and hitsAddend as the request set them, the
	// metadata of the descriptors that passed merged with the first one's
	// values winning, quota mode) and ours (limitOverride, statuses, each
	// descriptor's metadata), exactly. The quota descriptor that is over
	// adds no metadata.
	want := `{"descriptors":[{"entries":["quota=m"],"metadata":{"team":"growth"}},{"entries":["quota=m"]},{"entries":["nope=x"]},` +
		`{"entries":["ip=1"],"limit":"requests_per_unit:1 unit:HOUR","limitOverride":{"requestsPerUnit":1,"unit":"HOUR"}},` +
		`{"entries":["tagged=1"],"metadata":{"team":"payments","owner":{"name":"ana","shift":"day"}}},` +
		`{"entries":["tagged2=1"],"metadata":{"owner":{"name":"bo","site":"lisbon"},"tier":"gold"}}],` +
		`"domain":"web","hitsAddend":1,` +
		`"metadata":{"team":"growth","owner":{"name":"ana","shift":"day","site":"lisbon"},"tier":"gold"},` +
		`"quotaModeEnabled":true,"quotaModeViolations":[1],` +
		`"statuses":[{"code":"OK","limitRemaining":0},{"code":"OVER_LIMIT","limitRemaining":0},{"code":"OK","limitRemaining":0},` +
		`{"code":"OK","limitRemaining":0},{"code":"OK","limitRemaining":4},{"code":"OK","limitRemaining":4}]}`
	var a, b any
	_ = json.Unmarshal(got, &a)
	_ = json.Unmarshal([]byte(want), &b)
	if !reflect.DeepEqual(a, b) {
		t.Errorf("dynamic_metadata =\n%s\nwant\n%s", got, want)
	}
}

func TestOverrideText(t *testing.T) {
	for _, tc := range []struct {
		o    *rlv3.RateLimitDescriptor_RateLimitOverride
		want string
	}{
		{&rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 9, Unit: typev3.RateLimitUnit_HOUR}, "requests_per_unit:9 unit:HOUR"},
		{&rlv3.RateLimitDescriptor_RateLimitOverride{Unit: typev3.RateLimitUnit_SECOND}, "unit:SECOND"},
		{&rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 4294967295}, "requests_per_unit:4294967295"},
		{&rlv3.RateLimitDescriptor_RateLimitOverride{}, ""},
	} {
		if got := overrideText(tc.o); got != tc.want {
			t.Errorf("overrideText(%v) = %q, want %q", tc.o, got, tc.want)
		}
		// The same text protobuf writes, up to the spaces it adds at random.
		if got := strings.Join(strings.Fields(tc.o.String()), " "); got != tc.want {
			t.Errorf("%v.String() = %q, want %q: the reference writes String()", tc.o, tc.o.String(), tc.want)
		}
	}
}

// TestDynamicMetadataRules: with DynamicMetadataRules each status names
// the rule that decided it, where it is written, how it matched and the
// limit reported.
func TestDynamicMetadataRules(t *testing.T) {
	s := newTestServer(t, Options{DynamicMetadata: true, DynamicMetadataRules: true})
	r := req("web", d("multi=1"), d("ip=1"), d("nope=x"))
	r.Descriptors[1].Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	resp, err := s.ShouldRateLimit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	statuses := resp.GetDynamicMetadata().AsMap()["statuses"].([]any)
	multi, ip, nope := statuses[0].(map[string]any), statuses[1].(map[string]any), statuses[2].(map[string]any)
	limit := multi["limit"].(map[string]any)
	if multi["rule"] != "multi" || multi["match"] != "key_only" || !strings.HasPrefix(multi["source"].(string), "test.yaml:") ||
		limit["name"] != "hourly" || limit["algorithm"] != "fixed_window" || limit["window"] != "1h0m0s" || limit["requestsPerUnit"] != 3.0 {
		t.Errorf("multi's status = %v, want the hourly limit (closest to its bound) of key-only rule multi", multi)
	}
	if ip["override"] != true || ip["match"] != "key_only" {
		t.Errorf("ip's status = %v, want override", ip)
	}
	if nope["match"] != "none" || nope["rule"] != nil {
		t.Errorf("an unmatched descriptor's status = %v", nope)
	}
}
