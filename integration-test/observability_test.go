package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/openrls/ratelimit/src/config/configtest"
)

const obsConfig = `
domain: obs
descriptors:
  - key: fixed
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: sliding_window}
  - key: bucket
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: token_bucket}
  - key: shadow
    shadow_mode: true
    metadata: {tier: trial}
    rate_limit: {unit: hour, requests_per_unit: 1}
`

func metricsBody(t testing.TB, p *proc) string {
	t.Helper()
	resp, err := http.Get("http://" + p.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return readBody(resp)
}

func countSeries(body, prefix string) int {
	n := 0
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

func TestMetricsAfterKnownTraffic(t *testing.T) {
	p := start(t, writeConfig(t, map[string]string{"obs.yaml": obsConfig}))
	for range 3 {
		p.should(t, "obs", configtest.Desc("fixed=a"))
	}
	for range 2 {
		p.should(t, "obs", configtest.Desc("shadow=a"))
	}
	body := metricsBody(t, p)
	for _, want := range []string{
		`ratelimit_service_rate_limit_total_hits{domain="obs",key="fixed"} 3`,
		`ratelimit_service_rate_limit_over_limit{domain="obs",key="fixed"} 1`,
		`ratelimit_service_rate_limit_within_limit{domain="obs",key="fixed"} 2`,
		`ratelimit_service_rate_limit_total_hits{domain="obs",key="shadow"} 2`,
		`ratelimit_service_rate_limit_shadow_mode{domain="obs",key="shadow"} 1`,
		`ratelimit_requests_total{code="over_limit"} 1`,
		`ratelimit_requests_total{code="ok"} 4`,
		`ratelimit_config_load_success_total 1`,
		`ratelimit_config_load_error_total 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	before := countSeries(body, "ratelimit_")
	for i := range 10_000 {
		p.should(t, "obs", configtest.Desc(fmt.Sprintf("fixed=user-%d", i)), configtest.Desc(fmt.Sprintf("unknown=%d", i)))
	}
	after := countSeries(metricsBody(t, p), "ratelimit_")
	if after != before {
		t.Errorf("10,000 distinct request values changed the number of ratelimit_ series from %d to %d", before, after)
	}
}

func TestHeadersAndDynamicMetadataPerAlgorithm(t *testing.T) {
	p := start(t, map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_REMAINING_HEADER": "X-Left",
		"RESPONSE_DYNAMIC_METADATA": "true", "RUNTIME_ROOT": writeConfig(t, map[string]string{"obs.yaml": obsConfig})["RUNTIME_ROOT"],
		"RUNTIME_SUBDIRECTORY": "ratelimit"})
	for _, key := range []string{"fixed", "sliding", "bucket"} {
		t.Run(key, func(t *testing.T) {
			var resp *rlsv3.RateLimitResponse
			for i, wantLeft := range []string{"1", "0", "0"} {
				resp = p.should(t, "obs", configtest.Desc(key+"=x"))
				h := headers(resp)
				if h["RateLimit-Limit"] != "2" || h["X-Left"] != wantLeft || h["RateLimit-Reset"] == "" {
					t.Errorf("call %d headers = %v, want limit 2, X-Left %s and a reset", i, h, wantLeft)
				}
			}
			if h := headers(resp); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || h["Retry-After"] == "" || h["Retry-After"] == "0" {
				t.Errorf("third call: %v with headers %v, want OVER_LIMIT with Retry-After", resp.GetOverallCode(), h)
			}
			md := resp.GetDynamicMetadata().AsMap()
			d0 := md["descriptors"].([]any)[0].(map[string]any)
			s0 := md["statuses"].([]any)[0].(map[string]any)
			if md["domain"] != "obs" || d0["entries"].([]any)[0] != key+"=x" || s0["code"] != "OVER_LIMIT" {
				t.Errorf("dynamic_metadata = %v, want the reference's shape and our statuses", md)
			}
		})
	}
	md := p.should(t, "obs", configtest.Desc("shadow=m")).GetDynamicMetadata().AsMap()
	if md["descriptors"].([]any)[0].(map[string]any)["metadata"].(map[string]any)["tier"] != "trial" {
		t.Errorf("dynamic_metadata of a passing descriptor lacks its config metadata: %v", md)
	}
}

func headers(resp *rlsv3.RateLimitResponse) map[string]string {
	h := map[string]string{}
	for _, kv := range resp.GetResponseHeadersToAdd() {
		h[kv.GetKey()] = kv.GetValue()
	}
	return h
}
