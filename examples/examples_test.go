// Package examples checks the shipped examples: Envoy's config against
// Envoy's API and against the rate limit config, and the Kubernetes and Istio
// manifests against their API types. Breaking a key in any of them fails here.
package examples

import (
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	streamv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
)

// loadBootstrap reads examples/envoy.yaml as Envoy would: YAML to JSON to
// the Bootstrap proto, unknown fields rejected, typed configs resolved.
func loadBootstrap(t *testing.T, name string, data []byte) *bootstrapv3.Bootstrap {
	t.Helper()
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(js, b); err != nil {
		t.Fatalf("%s is not a valid Bootstrap: %v", name, err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("%s fails Envoy's validation: %v", name, err)
	}
	return b
}

func TestEnvoyExample(t *testing.T) {
	b, cfg := loadExample(t, "envoy.yaml", "ratelimit-config.yaml")
	checkBootstrap(t, b, cfg)
}

// loadExample loads an Envoy bootstrap and the descriptor config it goes
// with.
func loadExample(t *testing.T, envoyFile, configFile string) (*bootstrapv3.Bootstrap, *config.Config) {
	t.Helper()
	data, err := os.ReadFile(envoyFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.LoadFiles([]string{configFile}, config.Options{})
	if err != nil {
		t.Fatalf("%s: %v", configFile, err)
	}
	return loadBootstrap(t, envoyFile, data), cfg
}

// connectionManagers returns the bootstrap's HTTP connection managers.
func connectionManagers(b *bootstrapv3.Bootstrap) []*hcmv3.HttpConnectionManager {
	var hcms []*hcmv3.HttpConnectionManager
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				h := &hcmv3.HttpConnectionManager{}
				if err := f.GetTypedConfig().UnmarshalTo(h); err == nil {
					hcms = append(hcms, h)
				}
			}
		}
	}
	return hcms
}

// checkBootstrap checks an Envoy bootstrap's rate limiting against cfg.
func checkBootstrap(t *testing.T, b *bootstrapv3.Bootstrap, cfg *config.Config) {
	t.Helper()
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	hcms := connectionManagers(b)
	if len(hcms) == 0 {
		t.Fatal("no HTTP connection manager in the bootstrap")
	}
	for _, h := range hcms {
		rl := rateLimitFilter(t, h)
		if rl.GetFailureModeDeny() || rl.GetTimeout().AsDuration() <= 0 ||
			rl.GetEnableXRatelimitHeaders() != ratelimitfilterv3.RateLimit_DRAFT_VERSION_03 {
			t.Errorf("rate limit filter: failure_mode_deny %v, timeout %v, headers %v; want false, a timeout and DRAFT_VERSION_03",
				rl.GetFailureModeDeny(), rl.GetTimeout(), rl.GetEnableXRatelimitHeaders())
		}
		name := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
		c := clusters[name]
		if c == nil {
			t.Fatalf("rate limit service cluster %q is not defined", name)
		}
		opts := &httpv3.HttpProtocolOptions{}
		if err := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].UnmarshalTo(opts); err != nil ||
			opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			t.Errorf("cluster %q does not speak HTTP/2, which gRPC needs", name)
		}
		domain := cfg.Domain(rl.GetDomain())
		if domain == nil {
			t.Fatalf("the filter's domain %q is not in ratelimit-config.yaml (domains %v)", rl.GetDomain(), cfg.Domains())
		}
		checkActions(t, append(routeRateLimits(h.GetRouteConfig().GetVirtualHosts()), rl.GetRateLimits()...), domain)
	}
}

// routeRateLimits lists the rate_limits entries of virtual hosts and their
// routes.
func routeRateLimits(vhosts []*routev3.VirtualHost) []*routev3.RateLimit {
	var limits []*routev3.RateLimit
	for _, vh := range vhosts {
		limits = append(limits, vh.GetRateLimits()...)
		for _, r := range vh.GetRoutes() {
			limits = append(limits, r.GetRoute().GetRateLimits()...)
		}
	}
	return limits
}

// TestEnvoyTokenUsageExample checks the check-then-report bootstrap: a
// request-path entry that only checks (hits_addend 0) and a stream-done
// entry that reports usage from a response header, both producing a
// descriptor whose every limit has overdraft.
func TestEnvoyTokenUsageExample(t *testing.T) {
	b, cfg := loadExample(t, "envoy-token-usage.yaml", "token-usage-ratelimit-config.yaml")
	checkBootstrap(t, b, cfg)
	rl := rateLimitFilter(t, connectionManagers(b)[0])
	var checks, reports int
	for i, e := range rl.GetRateLimits() {
		switch ha := e.GetHitsAddend(); {
		case !e.GetApplyOnStreamDone() && ha.GetNumber() != nil && ha.GetNumber().GetValue() == 0:
			checks++
		case e.GetApplyOnStreamDone() && strings.HasPrefix(ha.GetFormat(), "%RESP(") && !ha.GetIsNegativeHits():
			reports++
		default:
			t.Errorf("rate_limits[%d] is neither a check (hits_addend 0) nor a report on stream done from a response header", i)
		}
		for _, p := range cfg.Domain(rl.GetDomain()).Reach(actionShape(t, e)) {
			for _, l := range cfg.Domain(rl.GetDomain()).LimitsAt(p) {
				if !l.Rule.Overdraft {
					t.Errorf("rate_limits[%d] reaches %s, whose limit %s has no overdraft: reports past it would be dropped", i, p, l)
				}
			}
		}
	}
	if checks != 1 || reports != 1 {
		t.Errorf("%d checks and %d reports, want one of each", checks, reports)
	}
}

func rateLimitFilter(t *testing.T, h *hcmv3.HttpConnectionManager) *ratelimitfilterv3.RateLimit {
	t.Helper()
	for _, f := range h.GetHttpFilters() {
		rl := &ratelimitfilterv3.RateLimit{}
		if f.GetTypedConfig().UnmarshalTo(rl) == nil {
			return rl
		}
	}
	t.Fatal("no envoy.filters.http.ratelimit filter")
	return nil
}

// checkActions checks that every descriptor the actions can produce reaches
// a limit, and that every limit is reached by some action.
func checkActions(t *testing.T, limits []*routev3.RateLimit, d *config.Domain) {
	t.Helper()
	reached := map[string]bool{}
	for i, rl := range limits {
		shape := actionShape(t, rl)
		paths := d.Reach(shape)
		if len(paths) == 0 {
			t.Errorf("rate_limits entry %d produces %v, which no rule of domain %q limits", i, shape, d.Name)
		}
		for _, p := range paths {
			reached[p] = true
		}
	}
	var missed []string
	for _, p := range d.LimitPaths() {
		if !reached[p] {
			missed = append(missed, p)
		}
	}
	sort.Strings(missed)
	if len(missed) > 0 {
		t.Errorf("rules no Envoy action can reach: %s", strings.Join(missed, ", "))
	}
}

// actionShape is the descriptor an entry's actions produce, in Envoy's
// terms: each action adds one entry, with a fixed or a per-request value.
func actionShape(t *testing.T, rl *routev3.RateLimit) []config.ShapeEntry {
	t.Helper()
	var shape []config.ShapeEntry
	for _, a := range rl.GetActions() {
		switch {
		case a.GetGenericKey() != nil:
			k := a.GetGenericKey().GetDescriptorKey()
			if k == "" {
				k = "generic_key"
			}
			shape = append(shape, config.ShapeEntry{Key: k, Value: a.GetGenericKey().GetDescriptorValue()})
		case a.GetRemoteAddress() != nil:
			shape = append(shape, config.ShapeEntry{Key: "remote_address", Dynamic: true})
		case a.GetRequestHeaders() != nil:
			shape = append(shape, config.ShapeEntry{Key: a.GetRequestHeaders().GetDescriptorKey(), Dynamic: true})
		case a.GetHeaderValueMatch() != nil:
			k := a.GetHeaderValueMatch().GetDescriptorKey()
			if k == "" {
				k = "header_match"
			}
			shape = append(shape, config.ShapeEntry{Key: k, Value: a.GetHeaderValueMatch().GetDescriptorValue()})
		default:
			t.Fatalf("the example uses an action this check does not model: %v", a)
		}
	}
	return shape
}

// TestEnvoyAccessLogPrintsTheRule: examples/envoy.yaml logs each request
// with the service's per-descriptor statuses from the rate limit filter's
// dynamic metadata namespace, the field where RESPONSE_DYNAMIC_METADATA_RULES
// puts the rule that decided.
func TestEnvoyAccessLogPrintsTheRule(t *testing.T) {
	data, err := os.ReadFile("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b := loadBootstrap(t, "envoy.yaml", data)
	found := false
	for _, h := range connectionManagers(b) {
		for _, al := range h.GetAccessLog() {
			out := &streamv3.StdoutAccessLog{}
			if al.GetTypedConfig().UnmarshalTo(out) != nil {
				continue
			}
			if strings.Contains(out.GetLogFormat().GetTextFormatSource().GetInlineString(), "%DYNAMIC_METADATA(envoy.filters.http.ratelimit:statuses)%") {
				found = true
			}
		}
	}
	if !found {
		t.Error("no stdout access log prints %DYNAMIC_METADATA(envoy.filters.http.ratelimit:statuses)%")
	}
}

// TestEnvoyConcurrencyExample: the take on the request path and the
// release on stream done name the same descriptor, of a concurrency
// limit, and the release gives back what the take's answer says it took.
func TestEnvoyConcurrencyExample(t *testing.T) {
	b, cfg := loadExample(t, "envoy-concurrency.yaml", "concurrency-ratelimit-config.yaml")
	checkBootstrap(t, b, cfg)
	rl := rateLimitFilter(t, connectionManagers(b)[0])
	var takes, releases int
	for i, e := range rl.GetRateLimits() {
		switch ha := e.GetHitsAddend(); {
		case !e.GetApplyOnStreamDone() && ha.GetNumber().GetValue() == 1 && !ha.GetIsNegativeHits():
			takes++
		case e.GetApplyOnStreamDone() && ha.GetIsNegativeHits() &&
			ha.GetFormat() == "%DYNAMIC_METADATA(envoy.filters.http.ratelimit:slotsTaken:"+strconv.Itoa(takes-1)+")%":
			releases++
		default:
			t.Errorf("rate_limits[%d] is neither a take (hits_addend 1) nor, after it, a release of its slotsTaken on stream done", i)
		}
		for _, p := range cfg.Domain(rl.GetDomain()).Reach(actionShape(t, e)) {
			for _, l := range cfg.Domain(rl.GetDomain()).LimitsAt(p) {
				if l.Rule.Algorithm != limiter.Concurrency {
					t.Errorf("rate_limits[%d] reaches %s, whose limit %s is not a concurrency limit", i, p, l)
				}
			}
		}
	}
	if takes != 1 || releases != 1 {
		t.Errorf("%d takes and %d releases, want one of each", takes, releases)
	}
}
