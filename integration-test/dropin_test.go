package integration

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/memcache/memcachedtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// TestGRPCUnixSocket: with GRPC_UDS the RLS is served on that Unix socket
// (Envoy's pipe cluster), and a stale socket file left by a killed process
// does not stop start-up.
func TestGRPCUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "ratelimit.sock")
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
	env["GRPC_UDS"] = sock
	p := start(t, env)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=a"))})
	if err != nil {
		t.Fatalf("ShouldRateLimit over %s: %v\n%s", sock, err, p.stderr)
	}
	if resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 2 {
		t.Errorf("answer over the socket = %v", resp)
	}
}

// TestGlobalQuotaMode: QUOTA_MODE=true puts every descriptor in quota mode:
// a request passes while one of its limited descriptors has budget left.
func TestGlobalQuotaMode(t *testing.T) {
	env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
	env["QUOTA_MODE"] = "true"
	p := start(t, env)
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := p.should(t, "it", configtest.Desc("user=a")).GetOverallCode(); got != want {
			t.Errorf("call %d with user=a alone: %v, want %v", i+1, got, want)
		}
	}
	resp := p.should(t, "it", configtest.Desc("user=a"), configtest.Desc("user=b"))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("user=a spent, user=b not: %v, want OK overall with user=a OVER_LIMIT", resp)
	}
}

// TestReferencePrometheusSeries: USE_PROMETHEUS=true serves the reference's
// series on PROMETHEUS_ADDR, in milliseconds when asked; DISABLE_STATS=true
// takes them away (this service's /metrics stays).
func TestReferencePrometheusSeries(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string
		not  []string
	}{
		{"on", map[string]string{}, []string{
			`ratelimit_service_rate_limit_total_hits{domain="it",key1="user",key2=""} 1`,
			`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 2`,
			`ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="0.005"}`,
			`ratelimit_service_config_load_success 1`,
			`ratelimit_requests_total{code="ok"} 2`,
			// What the reference's mapping does not name, under the
			// statsd exporter's default names.
			"# TYPE ratelimit_go_heapAlloc gauge\nratelimit_go_heapAlloc ",
			"# TYPE ratelimit_go_totalAlloc counter\nratelimit_go_totalAlloc ",
			"ratelimit_go_numGoroutine ",
			"runtime_load_attempts 1",
			"runtime_num_values 1",
			"ratelimit_service_rate_limit_nope_domain_not_found 1",
		}, []string{`key="user"`}},
		{"milliseconds", map[string]string{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": "true"}, []string{
			// The exporter's default bounds, as the reference keeps them.
			`ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="0.005"}`,
			`ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="10"}`,
		}, []string{`le="5000"`}},
		{"disabled", map[string]string{"DISABLE_STATS": "true"}, []string{`ratelimit_requests_total{code="ok"} 2`},
			[]string{"ratelimit_service_total_requests"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
			addr := "127.0.0.1:" + strconv.Itoa(freePorts(t, 1)[0])
			env["USE_PROMETHEUS"] = "true"
			env["PROMETHEUS_ADDR"] = addr
			for k, v := range tc.env {
				env[k] = v
			}
			p := start(t, env)
			p.should(t, "it", configtest.Desc("user=a"))
			p.should(t, "nope", configtest.Desc("a=1"))
			resp, err := http.Get("http://" + addr + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(resp)
			for _, w := range tc.want {
				if !strings.Contains(body, w) {
					t.Errorf("PROMETHEUS_ADDR lacks %s", w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(body, n) {
					t.Errorf("PROMETHEUS_ADDR has %s", n)
				}
			}
		})
	}
}

// TestRedisReferenceSpellings: the reference's spellings and defaults work
// as they do there: REDIS_TYPE=SINGLE, and REDIS_URL a socket path without
// REDIS_SOCKET_TYPE (the reference defaults the socket type to unix).
func TestRedisReferenceSpellings(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "redis.sock")
	redistest.Start(t, "--unixsocket", sock, "--unixsocketperm", "700")
	env := redisEnv(t, map[string]string{"REDIS_URL": sock, "REDIS_TYPE": "SINGLE", "REDIS_SOCKET_TYPE": unset})
	p := start(t, env)
	if got := hammer(t, []*proc{p}, 48); got != 40 {
		t.Errorf("48 requests on a limit of 40 over the socket: allowed %d, want 40\n%s", got, p.stderr)
	}
}

// TestRolloutBound is docs/migrating.md's rollout arithmetic, on the binary:
// while the reference and this service both serve, each counts in keys of
// its own. Two fleets stand for them here, their counters apart by
// CACHE_KEY_PREFIX as the reference's keys are apart from ours. A load over
// both admits exactly twice the limit; with the procedure's halved limit,
// exactly the limit.
func TestRolloutBound(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit string
		want  int
	}{{"full limit on both: the bound", "40", 80}, {"halved on both: the procedure", "20", 40}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			cfg := strings.Replace(sharedConfig, "requests_per_unit: 40", "requests_per_unit: "+tc.limit, 1)
			fleet := func(prefix string) *proc {
				env := writeConfig(t, map[string]string{"shared.yaml": cfg})
				env["REDIS_URL"] = srv.Addr
				env["CACHE_KEY_PREFIX"] = prefix
				return start(t, env)
			}
			procs := []*proc{fleet("reference_"), fleet("")}
			if got := hammer(t, procs, 80); got != tc.want {
				t.Errorf("160 requests over both fleets on a limit of %s: allowed %d, want %d", tc.limit, got, tc.want)
			}
		})
	}
}

// TestReferenceVariablesNotHonouredAreNamed: a variable of the reference
// that this service does not honour is named at start-up with why, and the
// service runs.
func TestReferenceVariablesNotHonouredAreNamed(t *testing.T) {
	env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
	env["REDIS_STARTUP_MAX_ELAPSED_TIME"] = "5"
	env["REDIS_STARTUP_INITIAL_INTERVAL"] = "1s"
	p := start(t, env)
	p.should(t, "it", configtest.Desc("user=a"))
	for _, want := range []string{"REDIS_STARTUP_INITIAL_INTERVAL: ignored:", "REDIS_STARTUP_MAX_ELAPSED_TIME: ignored:"} {
		if !strings.Contains(p.stderr.String(), want) {
			t.Errorf("start-up log lacks %q:\n%s", want, p.stderr)
		}
	}
}

// TestDebugLogNamesEachDecision: with LOG_LEVEL=debug the binary logs one
// line per descriptor naming the rule, the store key and the decision (the
// reference logs the lookup and the limit at debug too).
func TestDebugLogNamesEachDecision(t *testing.T) {
	env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
	env["LOG_LEVEL"] = "debug"
	p := start(t, env)
	p.should(t, "it", configtest.Desc("user=dbg"))
	eventually(t, "a decision line", func() bool {
		out := p.stderr.String()
		return strings.Contains(out, `descriptor="user=dbg"`) && strings.Contains(out, `rule="user (`) &&
			strings.Contains(out, "2 per hour, fixed_window key=") && strings.Contains(out, " OK remaining=1")
	})
}

// TestExplainOverTheWire: the debug port's /explain (what bin/client
// -explain asks) tells how the served config decides a request and counts
// nothing: after it, the first real call still has the whole limit.
func TestExplainOverTheWire(t *testing.T) {
	p := start(t, writeConfig(t, map[string]string{"it.yaml": basicConfig}))
	for range 3 {
		resp, err := http.Get("http://" + p.debugAddr + "/explain?domain=it&descriptor=user%3Dwire")
		if err != nil {
			t.Fatal(err)
		}
		body := readBody(resp)
		for _, want := range []string{"# config version ", "descriptors[0] user=wire\n", "  user=wire: key only, any value (", "  limit: 2 per hour, fixed_window  key {"} {
			if !strings.Contains(body, want) {
				t.Fatalf("/explain lacks %q:\n%s", want, body)
			}
		}
	}
	if got := p.should(t, "it", configtest.Desc("user=wire")).GetStatuses()[0].GetLimitRemaining(); got != 1 {
		t.Errorf("first real call after three explanations: %d remaining, want 1 (nothing counted)", got)
	}
	resp, err := http.Get("http://" + p.debugAddr + "/explain?domain=it")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("/explain without descriptors = %d, want 400", resp.StatusCode)
	}
	resp.Body.Close()
}

// TestWhoIsLimited: /limited on the debug port lists the descriptors
// answered OVER_LIMIT most: three hot values in a flood of 100,000
// distinct ones top it, the memory it holds stays flat, and a value the
// config hashes in keys is shown hashed.
func TestWhoIsLimited(t *testing.T) {
	p := start(t, writeConfig(t, map[string]string{"it.yaml": `
domain: it
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: token
    hash_value: true
    rate_limit: {unit: hour, requests_per_unit: 0}
`}))
	p.should(t, "it", configtest.Desc("token=s3cret-token"))
	resp, err := http.Get("http://" + p.debugAddr + "/limited?format=table")
	if err != nil {
		t.Fatal(err)
	}
	if table := readBody(resp); strings.Contains(table, "s3cret") || !strings.Contains(table, "token=#") {
		t.Errorf("a hashed value is not shown hashed:\n%s", table)
	}
	send := func(from, to int) {
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := from + g; i < to; i += 8 {
					v := "cold-" + strconv.Itoa(i)
					if i%10 == 0 {
						v = []string{"hot-a", "hot-b", "hot-c"}[(i/10)%3]
					}
					p.should(t, "it", configtest.Desc("user="+v))
				}
			}()
		}
		wg.Wait()
	}
	send(0, 10_000)
	early := memKB(t, p, "VmRSS")
	send(10_000, 100_000)
	late := memKB(t, p, "VmRSS")
	resp, err = http.Get("http://" + p.debugAddr + "/limited?n=3")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Limited []struct {
			Domain, Rule, Values string
			Count                uint64
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	hot := map[string]bool{}
	for _, e := range got.Limited {
		hot[e.Values] = e.Domain == "it" && e.Rule == "user" && e.Count >= 3000
	}
	for _, v := range []string{"user=hot-a", "user=hot-b", "user=hot-c"} {
		if !hot[v] {
			t.Errorf("%s is not on top with its count: %+v", v, got.Limited)
		}
	}
	if late-early > 20*1024 {
		t.Errorf("resident memory grew %d KiB over 90,000 more distinct limited values, want it flat", late-early)
	} else {
		t.Logf("resident %d KiB after 10,000 requests, %d KiB after 100,000", early, late)
	}
}

// TestTopLimitedSeries: with TOP_LIMITED_METRIC=2, /metrics carries the two
// descriptors limited most, and never more series, whatever the values.
func TestTopLimitedSeries(t *testing.T) {
	env := writeConfig(t, map[string]string{"it.yaml": "domain: it\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 0}\n"})
	env["TOP_LIMITED_METRIC"] = "2"
	p := start(t, env)
	for i := range 50 {
		v := "v" + strconv.Itoa(i)
		if i%2 == 0 {
			v = "hot"
		}
		p.should(t, "it", configtest.Desc("user="+v))
	}
	m := metricsBody(t, p)
	if n := strings.Count(m, "\nratelimit_limited_top{"); n != 2 {
		t.Errorf("%d ratelimit_limited_top series, want 2:\n%s", n, m)
	}
	if !strings.Contains(m, `ratelimit_limited_top{domain="it",rule="user",values="user=hot"} 25`) {
		t.Errorf("the hot value's series is missing:\n%s", m)
	}
}

// TestDynamicMetadataNamesTheRule: RESPONSE_DYNAMIC_METADATA_RULES=true
// puts, per descriptor, the rule that decided, where it is written, how it
// matched and the limit, where examples/envoy.yaml's access log prints it.
func TestDynamicMetadataNamesTheRule(t *testing.T) {
	env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
	env["RESPONSE_DYNAMIC_METADATA"] = "true"
	env["RESPONSE_DYNAMIC_METADATA_RULES"] = "true"
	p := start(t, env)
	st := p.should(t, "it", configtest.Desc("user=md")).GetDynamicMetadata().AsMap()["statuses"].([]any)[0].(map[string]any)
	limit, _ := st["limit"].(map[string]any)
	if st["rule"] != "user" || st["match"] != "key_only" || !strings.HasSuffix(st["source"].(string), "it.yaml:4") ||
		limit["window"] != "1h0m0s" || limit["requestsPerUnit"] != 2.0 {
		t.Errorf("statuses[0] = %v", st)
	}
}

// TestOverlappingWildcards: of two wildcards that both match, the first in
// the file applies, as in the reference; WILDCARD_PRECEDENCE=most_literal
// picks the more literal one.
func TestOverlappingWildcards(t *testing.T) {
	const cfg = `domain: w
descriptors:
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: path
    value: /api/upload/*
    rate_limit: {unit: minute, requests_per_unit: 5}
`
	for _, tc := range []struct {
		precedence string
		want       uint32
	}{{unset, 100}, {"first", 100}, {"most_literal", 5}} {
		env := writeConfig(t, map[string]string{"w.yaml": cfg})
		env["WILDCARD_PRECEDENCE"] = tc.precedence
		p := start(t, env)
		if got := p.should(t, "w", configtest.Desc("path=/api/upload/x")).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != tc.want {
			t.Errorf("WILDCARD_PRECEDENCE=%q: /api/upload/x limited at %d per minute, want %d", tc.precedence, got, tc.want)
		}
		p.stop(t)
	}
	code, out := runToExit(t, map[string]string{"WILDCARD_PRECEDENCE": "longest"})
	if code == 0 || !strings.Contains(out, `WILDCARD_PRECEDENCE: want first or most_literal, got "longest"`) {
		t.Errorf("a bad WILDCARD_PRECEDENCE: exit %d, output %q", code, out)
	}
}

// TestReferenceStatsdSeries: the statsd series the reference sends beside
// the per-rule ones, as /stats (the statsd names) shows them from the
// binary on Redis: domain_not_found per descriptor of an unknown domain,
// the Go runtime's figures, the Redis pool's connections and the runtime
// loader's counts; and an IPv4 value in a detailed stat name with its dots
// written "_".
func TestReferenceStatsdSeries(t *testing.T) {
	r := redistest.Start(t)
	env := writeConfig(t, map[string]string{"it.yaml": basicConfig, "edge.yaml": `domain: edge
descriptors:
  - key: remote_address
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
`})
	env["REDIS_URL"] = r.Addr
	p := start(t, env)
	p.should(t, "nope", configtest.Desc("a=1"), configtest.Desc("b=2"))
	p.should(t, "edge", configtest.Desc("remote_address=10.1.2.3"))
	stats := debugStats(t, p)
	for name, want := range map[string]uint64{
		"ratelimit.service.rate_limit.nope.domain_not_found":                   2,
		"ratelimit.service.rate_limit.edge.remote_address_10_1_2_3.total_hits": 1,
		"runtime.num_values": 2,
		"ratelimit.service.rate_limit.edge.remote_address_10.1.2.3.total_hits":   0, // not with dots
		"ratelimit.service.rate_limit.edge.remote_address_10_1_2_3.within_limit": 1,
	} {
		if stats[name] != want {
			t.Errorf("/stats %s = %d, want %d", name, stats[name], want)
		}
	}
	for _, name := range []string{"ratelimit.go.numGoroutine", "ratelimit.go.totalAlloc", "ratelimit.go.heapAlloc", "ratelimit.go.sys",
		"ratelimit.redis_pool.cx_active", "ratelimit.redis_pool.cx_total", "runtime.load_attempts"} {
		if stats[name] == 0 {
			t.Errorf("/stats %s = 0, want it counted", name)
		}
	}
}

// TestNearOverSplitAsTheReference: hits that cross a limit count as
// near_limit up to it and over_limit past it, as envoyproxy/ratelimit counts
// them, on every store: limit 10 an hour, one value hit 7 then 7, one 5, 5
// then 5, one 1 twelve times: near 2+2+2, over 4+5+2.
func TestNearOverSplitAsTheReference(t *testing.T) {
	cfg := map[string]string{"n.yaml": "domain: n\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n"}
	for _, store := range []string{"memory", "redis", "memcache"} {
		t.Run(store, func(t *testing.T) {
			env := writeConfig(t, cfg)
			switch store {
			case "redis":
				env["BACKEND_TYPE"], env["REDIS_URL"] = "redis", redistest.Start(t).Addr
			case "memcache":
				env["BACKEND_TYPE"], env["MEMCACHE_HOST_PORT"] = "memcache", memcachedtest.Start(t).Addr
			}
			p := start(t, env)
			ask := func(value string, hits uint32) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if _, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "n", HitsAddend: hits,
					Descriptors: descs(configtest.Desc("k=" + value))}); err != nil {
					t.Fatal(err)
				}
			}
			ask("a", 7)
			ask("a", 7)
			for range 3 {
				ask("b", 5)
			}
			for range 12 {
				ask("c", 1)
			}
			stats := debugStats(t, p)
			for stat, want := range map[string]uint64{"near_limit": 6, "over_limit": 11, "total_hits": 41, "within_limit": 27} {
				if got := stats["ratelimit.service.rate_limit.n.k."+stat]; got != want {
					t.Errorf("%s = %d, want %d", stat, got, want)
				}
			}
		})
	}
}

// TestLocalCacheStatsdGauges: with LOCAL_CACHE_SIZE_IN_BYTES on Redis, the
// reference's ratelimit.localcache.* gauges are sent, each counting what
// it names: one key over its limit is one entry, answered from the cache
// (a hit, and its access time), nothing expired, overwritten or
// evacuated yet.
func TestLocalCacheStatsdGauges(t *testing.T) {
	env := writeConfig(t, map[string]string{"c.yaml": "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"})
	env["REDIS_URL"], env["LOCAL_CACHE_SIZE_IN_BYTES"] = redistest.Start(t).Addr, "1000000"
	p := start(t, env)
	before := time.Now().Unix()
	for range 3 {
		p.should(t, "c", configtest.Desc("k=v"))
	}
	stats := debugStats(t, p)
	for name, want := range map[string]uint64{"entryCount": 1, "hitCount": 1, "expiredCount": 0, "overwriteCount": 0, "evacuateCount": 0} {
		if got, ok := stats["ratelimit.localcache."+name]; !ok || got != want {
			t.Errorf("ratelimit.localcache.%s = %d (sent: %v), want %d", name, got, ok, want)
		}
	}
	if got := stats["ratelimit.localcache.averageAccessTime"]; got < uint64(before) || got > uint64(time.Now().Unix()) {
		t.Errorf("ratelimit.localcache.averageAccessTime = %d, want the unix time of the last answer", got)
	}
}
