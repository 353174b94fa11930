package settings

import (
	"strings"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/config"
)

// TestOptionsCarryTheSettings: each group's method hands its package what
// the environment set, including the spellings that differ between the
// two (GRPC_ABUSE_COOLDOWN=0 is "off", a negative cooldown to the guard;
// REDIS_POOL_ON_EMPTY_BEHAVIOR=CREATE waits up to the Redis timeout).
func TestOptionsCarryTheSettings(t *testing.T) {
	for name, v := range map[string]string{
		"GRPC_HOST": "127.0.0.1", "GRPC_PORT": "9001", "PORT": "9002", "DEBUG_PORT": "9003",
		"GRPC_ABUSE_COOLDOWN": "0", "GRPC_MAX_CONNECTIONS": "11", "GRPC_MAX_CALLS_IN_FLIGHT": "12",
		"HTTP_MAX_CONNECTIONS_PER_ADDRESS": "13", "REQUEST_MAX_BYTES": "4096", "PROMETHEUS_PATH": "/m",
		"BACKEND_FAILURE_POLICY": "allow", "QUOTA_MODE": "true", "LIMIT_RESET_HEADER": "X-Reset",
		"REQUEST_MAX_KEYS": "9", "REQUEST_MAX_ENTRIES": "5",
		"MEMORY_MAX_KEYS": "640", "CACHE_KEY_PREFIX": "p:", "LEASE_IDLE": "3s",
		"CIRCUIT_BREAKER_FAILURES": "7", "REDIS_URL": "127.0.0.1:1", "REDIS_POOL_ON_EMPTY_BEHAVIOR": "CREATE",
		"REDIS_PIPELINE_WINDOW": "0", "MERGE_DOMAIN_CONFIG": "true", "WILDCARD_PRECEDENCE": "most_literal",
		"CONFIG_GRPC_XDS_NODE_ID": "n1", "CONFIG_GRPC_XDS_NODE_METADATA": "a:1,b=2",
		"TRACING_SERVICE_NAME": "rl", "STATSD_HOST": "127.0.0.2", "STATSD_PORT": "9125", "EXTRA_TAGS": "env:test",
		"NEAR_LIMIT_RATIO": "0.5", "USE_PROMETHEUS": "true", "DISABLE_STATS": "true",
	} {
		t.Setenv(name, v)
	}
	s, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	srv := s.ServerOptions()
	if srv.GRPCAddr != "127.0.0.1:9001" || srv.HTTPAddr != "0.0.0.0:9002" || srv.DebugAddr != "127.0.0.1:9003" ||
		srv.MaxRequestBytes != 4096 || srv.MetricsPath != "/m" || srv.HTTPLimits.MaxConnectionsPerAddress != 13 {
		t.Errorf("ServerOptions = %+v", srv)
	}
	if g := srv.Guard; g.Cooldown >= 0 || g.MaxConnections != 11 || g.MaxInFlight != 12 {
		t.Errorf("GuardOptions = %+v, want a negative cooldown (off), 11 connections, 12 calls", g)
	}
	t.Setenv("GRPC_ABUSE_COOLDOWN", "2s")
	if s2, err := Load(); err != nil || s2.GuardOptions().Cooldown != 2*time.Second {
		t.Errorf("GRPC_ABUSE_COOLDOWN=2s: cooldown %v, %v", s2.GuardOptions().Cooldown, err)
	}
	svc := s.ServiceOptions()
	if svc.FailurePolicy != "allow" || !svc.QuotaMode || svc.Headers.Reset != "X-Reset" || svc.Limits.MaxKeys != 9 || svc.Limits.MaxEntries != 5 {
		t.Errorf("ServiceOptions = %+v", svc)
	}
	if m := s.MemoryOptions(); m.MaxKeys != 640 {
		t.Errorf("MemoryOptions = %+v", m)
	}
	if r := s.RedisOptions(s.Redis); r.Prefix != "p:" || r.LeaseIdle != 3*time.Second || r.Batch {
		t.Errorf("RedisOptions = %+v, want prefix p:, lease idle 3s, no batching", r)
	}
	if b := s.BreakerOptions(); b.Failures != 7 {
		t.Errorf("BreakerOptions = %+v", b)
	}
	c, err := s.Redis.ClientOptions()
	if err != nil || c.URL != "127.0.0.1:1" || c.PoolTimeout != 0 || c.Timeout != time.Second {
		t.Errorf("ClientOptions = %+v, %v; want no pool wait of its own under CREATE", c, err)
	}
	if co := s.ConfigOptions(); !co.MergeDomains || co.MaxDepth != 5 || co.Wildcards != config.WildcardMostLiteral {
		t.Errorf("ConfigOptions = %+v", co)
	}
	x, err := s.XDSOptions()
	if err != nil || x.NodeID != "n1" || x.NodeMetadata["a"] != "1" || x.NodeMetadata["b"] != "2" || x.DialOptions != nil {
		t.Errorf("XDSOptions = %+v, %v", x, err)
	}
	if st := s.StatsdOptions(); st.Addr != "127.0.0.2:9125" || st.Network != "tcp" || st.Tags["env"] != "test" {
		t.Errorf("StatsdOptions = %+v", st)
	}
	if m := s.MetricsOptions(); m.NearLimitRatio != 0.5 || m.Reference || len(m.FailurePolicies) == 0 {
		t.Errorf("MetricsOptions = %+v, want ratio 0.5 and no reference series under DISABLE_STATS", m)
	}
	if tr := s.TracingOptions(); tr.ServiceName != "rl" || tr.Enabled {
		t.Errorf("TracingOptions = %+v", tr)
	}
}

// TestOptionsNameTheFileThatFails: TLS files that do not load fail the
// options, naming what failed.
func TestOptionsNameTheFileThatFails(t *testing.T) {
	missing := t.TempDir() + "/missing.pem"
	r := Redis{URL: "127.0.0.1:1", TLS: true, TLSCACert: missing}
	if _, err := r.ClientOptions(); err == nil || !strings.HasPrefix(err.Error(), "TLS: ") || !strings.Contains(err.Error(), "missing.pem") {
		t.Errorf("Redis TLS with a missing CA: %v", err)
	}
	c := ConfigSource{XDSServerUseTLS: true, XDSServerTLSCA: missing}
	if _, err := c.XDSOptions(); err == nil || !strings.Contains(err.Error(), "missing.pem") {
		t.Errorf("xDS TLS with a missing CA: %v", err)
	}
}
