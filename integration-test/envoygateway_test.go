package integration

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
	"github.com/openrls/ratelimit/src/tlstest"
)

// egMapping is the statsd-exporter mapping Envoy Gateway installs beside
// the rate limit Deployment (internal/infrastructure/kubernetes/ratelimit/
// statsd_conf.yaml in envoyproxy/gateway), as glob, metric name and label
// names in capture order. Everything else it drops.
var egMapping = []struct {
	glob, name string
	labels     []string
}{
	{"ratelimit.service.rate_limit.*.*.near_limit", "ratelimit_service_rate_limit_near_limit", []string{"domain", "key1"}},
	{"ratelimit.service.rate_limit.*.*.over_limit", "ratelimit_service_rate_limit_over_limit", []string{"domain", "key1"}},
	{"ratelimit.service.rate_limit.*.*.total_hits", "ratelimit_service_rate_limit_total_hits", []string{"domain", "key1"}},
	{"ratelimit.service.rate_limit.*.*.within_limit", "ratelimit_service_rate_limit_within_limit", []string{"domain", "key1"}},
	{"ratelimit.service.rate_limit.*.*.*.near_limit", "ratelimit_service_rate_limit_near_limit", []string{"domain", "key1", "key2"}},
	{"ratelimit.service.rate_limit.*.*.*.over_limit", "ratelimit_service_rate_limit_over_limit", []string{"domain", "key1", "key2"}},
	{"ratelimit.service.rate_limit.*.*.*.total_hits", "ratelimit_service_rate_limit_total_hits", []string{"domain", "key1", "key2"}},
	{"ratelimit.service.rate_limit.*.*.*.within_limit", "ratelimit_service_rate_limit_within_limit", []string{"domain", "key1", "key2"}},
	{"ratelimit.service.call.should_rate_limit.*", "ratelimit_service_should_rate_limit_error", []string{"err_type"}},
	{"ratelimit_server.*.total_requests", "ratelimit_service_total_requests", []string{"grpc_method"}},
	{"ratelimit_server.*.response_time", "ratelimit_service_response_time_seconds", []string{"grpc_method"}},
	{"ratelimit.service.config_load_success", "ratelimit_service_config_load_success", nil},
	{"ratelimit.service.config_load_error", "ratelimit_service_config_load_error", nil},
	{"ratelimit.service.rate_limit.*.*.*.shadow_mode", "ratelimit_service_rate_limit_shadow_mode", []string{"domain", "key1", "key2"}},
}

// egSeries maps a statsd name as the exporter does with Envoy Gateway's
// mapping: the first glob that matches (a * is one dot-free component)
// names the series; ok is false when the exporter would drop the line.
func egSeries(name string) (series string, ok bool) {
	for _, m := range egMapping {
		re := "^" + strings.ReplaceAll(regexp.QuoteMeta(m.glob), `\*`, `([^.]+)`) + "$"
		sub := regexp.MustCompile(re).FindStringSubmatch(name)
		if sub == nil {
			continue
		}
		var labels []string
		for i, l := range m.labels {
			labels = append(labels, l+"="+sub[i+1])
		}
		return m.name + "{" + strings.Join(labels, ",") + "}", true
	}
	return "", false
}

// statsdLines collects the lines a TCP statsd collector receives.
type statsdLines struct {
	mu    sync.Mutex
	lines []string
}

func (s *statsdLines) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...)
}

// listenStatsdTCP is a statsd collector on TCP, as the exporter Envoy
// Gateway runs beside the service.
func listenStatsdTCP(t *testing.T) (port int, got *statsdLines) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	got = &statsdLines{}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					got.mu.Lock()
					got.lines = append(got.lines, sc.Text())
					got.mu.Unlock()
				}
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port, got
}

// egConfig is a RateLimitConfig of the shape Envoy Gateway's translator
// emits for one listener: domain and keys with "/", a parent level per
// route rule without rate_limit, its match keys below it (a value, or a
// key-only child written as value ""), detailed_metric and shadow_mode.
func egConfig(rpu uint32) *rlconfv3.RateLimitConfig {
	rule := "httproute/default/http-ratelimit/rule/0/match/-1"
	return &rlconfv3.RateLimitConfig{Name: "default/eg/http", Domain: "default/eg/http", Descriptors: []*rlconfv3.RateLimitDescriptor{{
		Key: rule, Value: rule,
		Descriptors: []*rlconfv3.RateLimitDescriptor{
			{Key: "rule-0-match-0", Value: "one", RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_HOUR, RequestsPerUnit: rpu}},
			{Key: "rule-0-match-1", Value: "", DetailedMetric: true,
				RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_HOUR, RequestsPerUnit: rpu}},
			{Key: "rule-0-match-2", Value: "", ShadowMode: true,
				RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_HOUR, RequestsPerUnit: 1}},
		},
	}}}
}

// TestEnvoyGatewayDeployment runs the binary with the environment of Envoy
// Gateway's generated rate limit Deployment (its default.yaml test fixture,
// with loopback addresses and temporary paths): config over xDS with mutual
// TLS, FORCE_START_WITHOUT_INITIAL_CONFIG, gRPC over TLS, statsd on port
// 9125's stand-in over TCP, Redis. It serves configs of the shapes Envoy
// Gateway's translator emits, pushes a change, and checks the answers and
// that the statsd lines the exporter receives map to the series Envoy
// Gateway's mapping makes.
func TestEnvoyGatewayDeployment(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "envoy-gateway-ca")
	crt, key := ca.Issue(t, "envoy-ratelimit", "envoy-ratelimit", "envoy-ratelimit.envoy-gateway-system.svc")
	xcrt, xkey := ca.Issue(t, "envoy-gateway", "envoy-gateway")
	certs := map[string]string{
		"tls.crt": tlstest.Write(t, dir, "tls.crt", crt), "tls.key": tlstest.Write(t, dir, "tls.key", key),
		"ca.crt": tlstest.Write(t, dir, "ca.crt", ca.PEM),
	}

	// Envoy Gateway's xDS server: mutual TLS, client certificates from its CA.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	pair, err := tls.X509KeyPair(xcrt, xkey)
	if err != nil {
		t.Fatal(err)
	}
	x := startXDS(t, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair},
		ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})))
	set := func(version string, rpu uint32) { x.set(t, "envoy-ratelimit", version, egConfig(rpu)) }

	statsdPort, lines := listenStatsdTCP(t)
	rds := redistest.Start(t)
	p := start(t, map[string]string{
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true",
		"RUNTIME_WATCH_ROOT": "false", "LOG_LEVEL": "info", "USE_STATSD": "true", "STATSD_PORT": strconv.Itoa(statsdPort),
		"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": x.addr,
		"CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit",
		"GRPC_SERVER_USE_TLS":     "true", "GRPC_SERVER_TLS_CERT": certs["tls.crt"], "GRPC_SERVER_TLS_KEY": certs["tls.key"],
		"GRPC_SERVER_TLS_CA_CERT":        certs["ca.crt"],
		"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": certs["tls.crt"],
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY": certs["tls.key"], "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": certs["ca.crt"],
		"FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": rds.Addr,
		// Ours, only so that the test need not wait ten seconds for a flush.
		"STATS_FLUSH_INTERVAL": "100ms",
	})

	// Envoy calls over TLS with the CA Envoy Gateway hands it.
	conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool,
		ServerName: "envoy-ratelimit.envoy-gateway-system.svc", MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	try := func(entries ...string) (*rlsv3.RateLimitResponse, error) {
		rule := "httproute/default/http-ratelimit/rule/0/match/-1"
		d := configtest.Desc(append([]string{rule + "=" + rule}, entries...)...)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "default/eg/http", Descriptors: []*rlv3.RateLimitDescriptor{d}})
	}
	call := func(entries ...string) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := try(entries...)
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		return resp
	}
	limitOf := func(r *rlsv3.RateLimitResponse) uint32 {
		return r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}

	// Started before any config (FORCE_START_WITHOUT_INITIAL_CONFIG):
	// healthy, and the first config arrives over xDS.
	set("1", 2)
	// Until it does, the service answers Unavailable (no config yet).
	eventually(t, "the first xDS config serves", func() bool {
		resp, err := try("rule-0-match-1=probe")
		return err == nil && limitOf(resp) == 2
	})
	for _, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := call("rule-0-match-0=one").GetOverallCode(); got != want {
			t.Errorf("value match: %v, want %v", got, want)
		}
	}
	for _, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := call("rule-0-match-1=client-7").GetOverallCode(); got != want {
			t.Errorf("key-only child: %v, want %v", got, want)
		}
	}
	for range 2 {
		if got := call("rule-0-match-2=x").GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
			t.Errorf("shadow_mode rule answered %v, want OK", got)
		}
	}
	if got := call("rule-0-match-0=two").GetStatuses()[0]; got.GetCurrentLimit() != nil {
		t.Errorf("an unmatched value got a limit: %v", got)
	}

	// A change pushed over xDS applies.
	set("2", 50)
	eventually(t, "the pushed change serves", func() bool { return limitOf(call("rule-0-match-1=client-8")) == 50 })

	// What the exporter receives maps to Envoy Gateway's series.
	parent := "httproute/default/http-ratelimit/rule/0/match/-1_httproute/default/http-ratelimit/rule/0/match/-1"
	want := []string{
		"ratelimit_service_rate_limit_total_hits{domain=default/eg/http,key1=" + parent + ",key2=rule-0-match-0_one}",
		"ratelimit_service_rate_limit_over_limit{domain=default/eg/http,key1=" + parent + ",key2=rule-0-match-0_one}",
		"ratelimit_service_rate_limit_over_limit{domain=default/eg/http,key1=" + parent + ",key2=rule-0-match-1_client-7}",
		"ratelimit_service_rate_limit_shadow_mode{domain=default/eg/http,key1=" + parent + ",key2=rule-0-match-2}",
		"ratelimit_service_total_requests{grpc_method=ShouldRateLimit}",
		"ratelimit_service_response_time_seconds{grpc_method=ShouldRateLimit}",
		"ratelimit_service_config_load_success{}",
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		series := map[string]bool{}
		for _, l := range lines.all() {
			name, _, _ := strings.Cut(l, ":")
			if s, ok := egSeries(name); ok {
				series[s] = true
			}
		}
		var missing []string
		for _, w := range want {
			if !series[w] {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("within 15s, no statsd line for %q; lines:\n%s", missing, strings.Join(lines.all(), "\n"))
		}
		time.Sleep(50 * time.Millisecond) // polling the collector
	}
	// Nothing else arrives but what the reference also sends and Envoy
	// Gateway's mapping drops: global shadow mode, the Go runtime's and the
	// Redis pool's figures, the runtime loader's counts.
	dropped := func(name string) bool {
		for _, p := range []string{"ratelimit.service.global_shadow_mode", "ratelimit.go.", "ratelimit.redis_pool.", "runtime."} {
			if strings.HasPrefix(name, p) {
				return true
			}
		}
		return false
	}
	for _, l := range lines.all() {
		name, _, _ := strings.Cut(l, ":")
		if _, ok := egSeries(name); !ok && !dropped(name) {
			t.Errorf("statsd line %q maps to no series of Envoy Gateway's mapping", l)
		}
	}
}
