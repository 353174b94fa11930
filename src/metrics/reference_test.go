package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestReferenceSeries: with USE_PROMETHEUS, PROMETHEUS_ADDR serves the
// reference's series (names, labels, units as its statsd-exporter mapping
// makes them) beside this service's own, whose per-rule series give way
// to the reference's of the same name.
func TestReferenceSeries(t *testing.T) {
	for _, millis := range []bool{false, true} {
		r := New(Options{Reference: true, ReferenceMillis: millis})
		r.Hit(r.Rule("mongo_cps", "database_users", false, "database_users"), Decision{Hits: 4, Used: 4, Limit: 10, Allowed: true})
		r.Hit(r.Rule("messaging", "message_type_marketing.to_number", false, "x"), Decision{Hits: 1, Used: 6, Limit: 5, Shadow: true})
		r.Hit(r.Rule("deep", "a.b.c", false, "a.b.c"), Decision{Hits: 1, Used: 1, Limit: 5, Allowed: true})
		// An IPv4 value's dots are written "_", as the reference writes them,
		// so the series keeps its two levels.
		r.Hit(r.Rule("edge", "remote_address_10.1.2.3", true, "remote_address"), Decision{Hits: 1, Used: 1, Limit: 5, Allowed: true})
		r.Request("ok", 2*time.Millisecond)
		r.Request("over_limit", 2*time.Millisecond)
		r.StatFunc("ratelimit.service.config_load_success", func() uint64 { return 3 })
		r.StatFunc("runtime.load_attempts", func() uint64 { return 5 })
		r.GaugeStatFunc("ratelimit.redis_pool.cx_active", func() uint64 { return 7 })
		r.DomainNotFound("nodomain", 2)
		rec := httptest.NewRecorder()
		r.ReferenceHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		body, _ := io.ReadAll(rec.Body)
		got := string(body)
		want := []string{
			`ratelimit_service_rate_limit_total_hits{domain="mongo_cps",key1="database_users",key2=""} 4`,
			`ratelimit_service_rate_limit_within_limit{domain="mongo_cps",key1="database_users",key2=""} 4`,
			`ratelimit_service_rate_limit_over_limit{domain="messaging",key1="message_type_marketing",key2="to_number"} 1`,
			`ratelimit_service_rate_limit_shadow_mode{domain="messaging",key1="message_type_marketing",key2="to_number"} 1`,
			`ratelimit_service_rate_limit_total_hits{domain="edge",key1="remote_address_10_1_2_3",key2=""} 1`,
			`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 2`,
			`ratelimit_service_should_rate_limit_error{err_type="redis_error"} 0`,
			`ratelimit_service_should_rate_limit_error{err_type="service_error"} 0`,
			`ratelimit_service_config_load_success 3`,
			`ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"} 2`,
			`ratelimit_requests_total{code="ok"} 1`, // ours, beside
			// A rule of three levels, under its first three parts, as the
			// mapping's regular expressions take them.
			`ratelimit_service_rate_limit_total_hits{domain="deep",key1="a",key2="b"} 1`,
			// Names no mapping line names, under the exporter's defaults.
			"# TYPE runtime_load_attempts counter\nruntime_load_attempts 5",
			"# TYPE ratelimit_redis_pool_cx_active gauge\nratelimit_redis_pool_cx_active 7",
			`ratelimit_service_rate_limit_nodomain_domain_not_found 2`,
			`ratelimit_service_global_shadow_mode 0`,
		}
		// The exporter's default buckets (0.005 to 10) either way; with
		// milliseconds the values are 2, not 0.002, as the reference's.
		if millis {
			want = append(want, `ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="1"} 0`,
				`ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="2.5"} 2`)
		} else {
			want = append(want, `ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="0.005"} 2`)
		}
		for _, w := range want {
			if !strings.Contains(got, w+"\n") {
				t.Errorf("millis=%v: no line %s", millis, w)
			}
		}
		for _, bad := range []string{`key="`, `key1="a",key2="b.c"`, `le="5000"`} {
			if strings.Contains(got, bad) {
				t.Errorf("millis=%v: %s appears; the reference has no such series", millis, bad)
			}
		}
	}
}
