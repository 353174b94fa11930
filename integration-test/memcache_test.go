package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/memcache/memcachedtest"
	"github.com/openrls/ratelimit/src/tlstest"
)

// TestMemcacheTwoReplicasExact: two binaries on one memcached
// (BACKEND_TYPE=memcache, as the reference is configured), 200 concurrent
// calls on a limit of 40: exactly 40 admitted, for the default counting
// and for REJECTED_HITS=drop (whose rejected hits are taken back).
func TestMemcacheTwoReplicasExact(t *testing.T) {
	mc := memcachedtest.Start(t)
	for _, rejected := range []string{"count", "drop"} {
		t.Run("REJECTED_HITS="+rejected, func(t *testing.T) {
			if err := mc.Do("flush_all"); err != nil {
				t.Fatal(err)
			}
			env := redisEnv(t, map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": mc.Addr, "REJECTED_HITS": rejected})
			procs := []*proc{start(t, env), start(t, env)}
			req := &rlsv3.RateLimitRequest{Domain: "shared", Descriptors: descs(configtest.Desc("k=hot"))}
			if got := send(t, procs, req, 10, 10); got != 40 {
				t.Errorf("200 concurrent calls through two replicas on a limit of 40: %d admitted, want exactly 40", got)
			}
			// Healthy on memcache (the reference's answers 500 there).
			resp, err := http.Get("http://" + procs[0].httpAddr + "/healthcheck")
			if err != nil {
				t.Fatal(err)
			}
			if readBody(resp); resp.StatusCode != http.StatusOK {
				t.Errorf("/healthcheck on memcache = %d, want 200", resp.StatusCode)
			}
		})
	}
}

// TestMemcacheOutage: with memcached gone, the binary answers OK by
// default, as envoyproxy/ratelimit does on memcache (it logs the failure
// and answers as if nothing were counted), so that Envoy's
// failure_mode_deny blocks nothing the reference passed;
// BACKEND_FAILURE_POLICY=error keeps this service's own answer
// (Unavailable).
func TestMemcacheOutage(t *testing.T) {
	for _, tc := range []struct {
		policy string
		want   codes.Code
	}{{"", codes.OK}, {"error", codes.Unavailable}} {
		t.Run("BACKEND_FAILURE_POLICY="+tc.policy, func(t *testing.T) {
			mc := memcachedtest.Start(t)
			env := redisEnv(t, map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": mc.Addr})
			if tc.policy != "" {
				env["BACKEND_FAILURE_POLICY"] = tc.policy
			}
			p := start(t, env)
			p.should(t, "shared", configtest.Desc("k=outage")) // served while memcached is up
			mc.Stop()
			for i := range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				resp, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "shared", Descriptors: descs(configtest.Desc("k=outage"))})
				cancel()
				if got := status.Code(err); got != tc.want || err == nil && resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					t.Fatalf("call %d with memcached down: %v %v, want %v (and OK)", i+1, resp.GetOverallCode(), err, tc.want)
				}
			}
		})
	}
}

// TestMemcacheSettingsErrors: memcache settings that can never work stop
// start-up, naming the variable.
func TestMemcacheSettingsErrors(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"BACKEND_TYPE": "memcache"}, "MEMCACHE_HOST_PORT: or MEMCACHE_SRV is required"},
		{map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "127.0.0.1"}, `MEMCACHE_HOST_PORT: "127.0.0.1": want host:port`},
		{map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_SRV": "memcache"}, "MEMCACHE_SRV"},
		{map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "127.0.0.1:1", "MEMCACHE_TLS": "true",
			"MEMCACHE_TLS_CACERT": "/nonexistent/ca.pem"}, "MEMCACHE_TLS"},
	} {
		code, out := runToExit(t, redisEnv(t, tc.env))
		if code == 0 || !strings.Contains(out, tc.want) {
			t.Errorf("%v: exit %d, output\n%s\nwant a failure naming %q", tc.env, code, out, tc.want)
		}
	}
}

// TestMemcacheTLS: MEMCACHE_TLS with the reference's variables, against a
// memcached that speaks only TLS and requires a client certificate: the
// binary counts there; without its client certificate it cannot.
func TestMemcacheTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "memcache-ca")
	cert, key := ca.Issue(t, "memcached", "localhost")
	ccert, ckey := ca.Issue(t, "ratelimit")
	caFile := tlstest.Write(t, dir, "ca.pem", ca.PEM)
	certFile, keyFile := tlstest.Write(t, dir, "server.pem", cert), tlstest.Write(t, dir, "server.key", key)
	ccertFile, ckeyFile := tlstest.Write(t, dir, "client.pem", ccert), tlstest.Write(t, dir, "client.key", ckey)
	pair, err := tls.X509KeyPair(ccert, ckey)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	mc := memcachedtest.StartTLS(t, certFile, keyFile, caFile, &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}})
	env := redisEnv(t, map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": mc.Addr, "MEMCACHE_TLS": "true",
		"MEMCACHE_TLS_CACERT": caFile, "MEMCACHE_TLS_CLIENT_CERT": ccertFile, "MEMCACHE_TLS_CLIENT_KEY": ckeyFile})
	p := start(t, env)
	for i := range 41 {
		resp := p.should(t, "shared", configtest.Desc("k=tls"))
		if want := i < 40; (resp.GetOverallCode() == rlsv3.RateLimitResponse_OK) != want {
			t.Fatalf("call %d over TLS: %v, want OK %v", i+1, resp, want)
		}
	}
	delete(env, "MEMCACHE_TLS_CLIENT_CERT")
	delete(env, "MEMCACHE_TLS_CLIENT_KEY")
	env["BACKEND_FAILURE_POLICY"] = "deny"
	q := start(t, env)
	if resp := q.should(t, "shared", configtest.Desc("k=notls")); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("without a client certificate: %v, want the failure policy's OVER_LIMIT", resp)
	}
}
