package metrics

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestHitClassification: hits split into within, near and over limit as
// envoyproxy/ratelimit splits them (its base limiter's arithmetic, with
// NEAR_LIMIT_RATIO 0.8), given the count before and after each decision.
func TestHitClassification(t *testing.T) {
	type counts = [ruleStats]uint64 // total, over, near, within, shadow, refunded, local cache
	for _, tc := range []struct {
		name string
		ds   []Decision
		want counts
	}{
		{"12 single hits on 10: 9 and 10 are near, 11 and 12 over", func() []Decision {
			var ds []Decision
			for i := uint64(1); i <= 12; i++ {
				ds = append(ds, Decision{Hits: 1, Used: min(i, 10), Limit: 10, Allowed: i <= 10})
			}
			return ds
		}(), counts{12, 2, 2, 10, 0, 0, 0}},
		{"3 hits allowed from 6 to 9: one past the threshold of 8", []Decision{{Hits: 3, Used: 9, Limit: 10, Allowed: true}},
			counts{3, 0, 1, 3, 0, 0, 0}},
		{"3 hits rejected at 9 of 10: one near, two over", []Decision{{Hits: 3, Used: 9, Limit: 10}},
			counts{3, 2, 1, 0, 0, 0, 0}},
		{"rejected at the limit, shadowed", []Decision{{Hits: 4, Used: 10, Limit: 10, Shadow: true}},
			counts{4, 4, 0, 0, 4, 0, 0}},
		{"crossing the limit, shadowed: shadow_mode counts what is over", []Decision{{Hits: 3, Used: 9, Limit: 10, Shadow: true}},
			counts{3, 2, 1, 0, 2, 0, 0}},
		{"answered by the local cache", []Decision{{Hits: 2, Used: 10, Limit: 10, Cached: true}},
			counts{2, 2, 0, 0, 0, 0, 2}},
		{"limit 0", []Decision{{Hits: 1, Used: 0, Limit: 0}}, counts{1, 1, 0, 0, 0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := New(Options{})
			rule := r.Rule("d", "k", false, "k")
			for _, d := range tc.ds {
				r.Hit(rule, d)
			}
			if got := rule.values(); got != tc.want {
				t.Errorf("counters = %v, want total/over/near/within/shadow/refunded/local cache %v", got, tc.want)
			}
		})
	}
	r := New(Options{})
	rule := r.Rule("d", "k", false, "k")
	r.Refund(rule, 6)
	if got := rule.Refunded.Load(); got != 6 {
		t.Errorf("refunded = %d, want 6", got)
	}
}

func TestDetailedSeriesAreCapped(t *testing.T) {
	r := New(Options{MaxDetailedSeries: 2})
	a := r.Rule("d", "k_1", true, "k")
	b := r.Rule("d", "k_2", true, "k")
	c := r.Rule("d", "k_3", true, "k")
	if a.Key != "k_1" || b.Key != "k_2" || c.Key != "k" {
		t.Errorf("keys = %s %s %s, want k_1 k_2 and the fallback k", a.Key, b.Key, c.Key)
	}
	if again := r.Rule("d", "k_1", true, "k"); again != a {
		t.Error("an existing detailed series was not reused")
	}
}

func TestStatsd(t *testing.T) {
	r := New(Options{})
	rule := r.Rule("mongo_cps", "database_users", false, "database_users")
	r.Hit(rule, Decision{Hits: 3, Used: 3, Limit: 10, Allowed: true})
	r.Hit(rule, Decision{Hits: 1, Used: 10, Limit: 10})
	r.Request("ok", time.Millisecond)
	r.Request("ok", time.Millisecond)
	r.GaugeStatFunc("ratelimit.localcache.hitCount", func() uint64 { return 7 })
	got := flushOnce(t, r, map[string]string{"env": "test"})
	for _, want := range []string{
		"ratelimit.localcache.hitCount.__env=test:7|g",
		"ratelimit.service.rate_limit.mongo_cps.database_users.total_hits.__env=test:4|c",
		"ratelimit.service.rate_limit.mongo_cps.database_users.over_limit.__env=test:1|c",
		"ratelimit.service.rate_limit.mongo_cps.database_users.within_limit.__env=test:3|c",
		"ratelimit_server.ShouldRateLimit.total_requests.__env=test:2|c",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("statsd packet %q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "shadow_mode") {
		t.Errorf("statsd sent an unchanged counter: %q", got)
	}
}

func TestStatsHandler(t *testing.T) {
	r := New(Options{NearLimitRatio: 0.8})
	r.Hit(r.Rule("b", "k", false, "k"), Decision{Hits: 1, Used: 1, Limit: 10, Allowed: true})
	users := r.Rule("a", "database_users", false, "database_users")
	r.Hit(users, Decision{Hits: 3, Used: 3, Limit: 10, Allowed: true})
	r.Hit(users, Decision{Hits: 1, Used: 10, Limit: 10})
	r.Request("ok", time.Millisecond)
	r.Request("over_limit", time.Millisecond)
	r.Request("invalid", time.Millisecond)
	r.Backend(time.Millisecond, errors.New("connection refused"))
	r.Backend(time.Millisecond, nil)
	r.ShadowOverride()
	loads := uint64(3)
	r.StatFunc("ratelimit.service.config_load_success", func() uint64 { return loads })
	rec := httptest.NewRecorder()
	r.StatsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/stats", nil))
	want := `ratelimit.service.rate_limit.a.database_users.total_hits: 4
ratelimit.service.rate_limit.a.database_users.over_limit: 1
ratelimit.service.rate_limit.a.database_users.near_limit: 0
ratelimit.service.rate_limit.a.database_users.within_limit: 3
ratelimit.service.rate_limit.a.database_users.shadow_mode: 0
ratelimit.service.rate_limit.a.database_users.refunded_hits: 0
ratelimit.service.rate_limit.a.database_users.over_limit_with_local_cache: 0
ratelimit.service.rate_limit.b.k.total_hits: 1
ratelimit.service.rate_limit.b.k.over_limit: 0
ratelimit.service.rate_limit.b.k.near_limit: 0
ratelimit.service.rate_limit.b.k.within_limit: 1
ratelimit.service.rate_limit.b.k.shadow_mode: 0
ratelimit.service.rate_limit.b.k.refunded_hits: 0
ratelimit.service.rate_limit.b.k.over_limit_with_local_cache: 0
ratelimit.service.call.should_rate_limit.redis_error: 1
ratelimit.service.call.should_rate_limit.service_error: 1
ratelimit.service.config_load_success: 3
ratelimit.service.global_shadow_mode: 1
ratelimit_server.ShouldRateLimit.total_requests: 3
`
	// Then Go's expvar, as envoyproxy/ratelimit prints it.
	got, vars, _ := strings.Cut(rec.Body.String(), "cmdline: ")
	if got != want || !strings.Contains(vars, "\nmemstats: {") {
		t.Errorf("/stats =\n%s\nwant\n%s\nthen cmdline and memstats", rec.Body.String(), want)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type = %q, want text/plain", ct)
	}
}

// TestHostileValuesCannotForgeStats: request values in a detailed rule's key
// end up in statsd lines and /stats lines; none of them may end a line,
// start a field or add a counter.
// TestIPv4StatNames: an IPv4 address in a rule's stat name has its dots
// written "_", as envoyproxy/ratelimit's SanitizeStatName writes them
// (unanchored: digits around the address stay); other dots stay.
func TestIPv4StatNames(t *testing.T) {
	tests := []struct{ key, want string }{
		{"remote_address_10.1.2.3", "remote_address_10_1_2_3"},
		{"remote_address_10.1.2.3.to_path", "remote_address_10_1_2_3.to_path"},
		{"x_1234.5.6.7", "x_1234_5_6_7"},
		{"v_1.2.3.4.5", "v_1_2_3_4.5"},
		{"a.b.c", "a.b.c"},
		{"version_1.2.3", "version_1.2.3"},
		{"ip_::ffff:10.0.0.1", "ip___ffff_10_0_0_1"},
	}
	for _, tt := range tests {
		if got := ruleStatPrefix("d", tt.key); got != "ratelimit.service.rate_limit.d."+tt.want {
			t.Errorf("ruleStatPrefix(d, %q) = %q, want ...d.%s", tt.key, got, tt.want)
		}
	}
}

func TestHostileValuesCannotForgeStats(t *testing.T) {
	tests := []struct{ name, key, want string }{
		{"statsd injection", "user_evil:5|c\nratelimit.injected:999999|c", "user_evil_5_c_ratelimit.injected_999999_c"},
		{"carriage return and tab", "a\r\tb", "a__b"},
		{"sample rate and tags", "x|@0.1|#tag:v", "x__0.1__tag_v"},
		{"stats line separator", "k: 42", "k__42"},
		{"safe bytes stay, an IPv4 address as the reference writes it", "remote_address_10.0.0.1/api-v1_é", "remote_address_10_0_0_1/api-v1_é"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := New(Options{})
			r.Hit(r.Rule("dom", tc.key, true, "k"), Decision{Hits: 1, Used: 1, Limit: 10, Allowed: true})

			rec := httptest.NewRecorder()
			r.StatsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/stats", nil))
			prefix := "ratelimit.service.rate_limit.dom." + tc.want + "."
			for _, line := range strings.Split(strings.TrimSuffix(rec.Body.String(), "\n"), "\n") {
				name, _, ok := strings.Cut(line, ": ")
				if !ok || strings.ContainsAny(name, " :\r\t") {
					t.Errorf("/stats line %q is not NAME: VALUE", line)
				}
				if strings.HasPrefix(name, "ratelimit.service.rate_limit.") && !strings.HasPrefix(name, prefix) {
					t.Errorf("/stats rule line %q, want the prefix %q", line, prefix)
				}
			}

			for _, line := range strings.Split(flushOnce(t, r, nil), "\n") {
				name, rest, ok := strings.Cut(line, ":")
				if !ok || strings.Count(rest, "|") != 1 || !strings.HasSuffix(rest, "|c") {
					t.Errorf("statsd line %q is not NAME:VALUE|c", line)
				}
				if strings.HasPrefix(name, "ratelimit.service.rate_limit.") && !strings.HasPrefix(name, prefix) {
					t.Errorf("statsd rule line %q, want the prefix %q", line, prefix)
				}
			}
		})
	}
}

// flushOnce runs RunStatsd against a loopback UDP socket until its one
// flush on the way out and returns the packet.
func flushOnce(t *testing.T, r *Registry, tags map[string]string) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // RunStatsd flushes once on the way out
	if err := r.RunStatsd(ctx, StatsdOptions{Network: "udp", Addr: pc.LocalAddr().String(), Interval: time.Hour, Tags: tags}); err != nil {
		t.Fatal(err)
	}
	_ = pc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	n, _, err := pc.ReadFrom(buf)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}

// TestCountersSaturate: a counter never wraps (Prometheus would read a
// reset); it stops at 2^64-1.
func TestCountersSaturate(t *testing.T) {
	r := New(Options{})
	rule := r.Rule("d", "k", false, "k")
	r.Hit(rule, Decision{Hits: 1, Used: 1, Limit: 10, Allowed: true})
	r.Hit(rule, Decision{Hits: math.MaxUint64 - 1, Used: 10, Limit: 10, Shadow: true})
	r.Hit(rule, Decision{Hits: 5, Used: 10, Limit: 10, Shadow: true})
	r.Refund(rule, math.MaxUint64)
	r.Refund(rule, 1)
	for name, got := range map[string]uint64{"total_hits": rule.TotalHits.Load(), "over_limit": rule.OverLimit.Load(),
		"refunded": rule.Refunded.Load()} {
		if got != math.MaxUint64 {
			t.Errorf("%s = %d, want it saturated at 2^64-1", name, got)
		}
	}
	if got := rule.ShadowMode.Load(); got != math.MaxUint64 {
		t.Errorf("shadow_mode = %d, want saturated", got)
	}
}

// TestDomainNotFoundIsBounded: unknown domains are counted apart up to 100;
// the rest under "_other", so a client naming random domains cannot grow
// the series without bound.
func TestDomainNotFoundIsBounded(t *testing.T) {
	r := New(Options{})
	for i := range 1000 {
		r.DomainNotFound(fmt.Sprintf("d%d", i), 2)
	}
	r.DomainNotFound("d0", 1)
	got := map[string]uint64{}
	for _, st := range r.notFoundStats() {
		got[st.name] = st.value()
	}
	if len(got) != maxNotFoundDomains+1 {
		t.Errorf("%d domain_not_found series, want %d", len(got), maxNotFoundDomains+1)
	}
	if v := got["ratelimit.service.rate_limit.d0.domain_not_found"]; v != 3 {
		t.Errorf("d0 = %d, want 3", v)
	}
	if v := got["ratelimit.service.rate_limit._other.domain_not_found"]; v != 2*(1000-maxNotFoundDomains) {
		t.Errorf("_other = %d, want %d", v, 2*(1000-maxNotFoundDomains))
	}
}
