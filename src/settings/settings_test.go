package settings

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestLoadDefaults(t *testing.T) {
	s, err := Load()
	if err != nil {
		t.Fatalf("Load() with an empty environment: %v", err)
	}
	if s.Port != 8080 || s.GRPCPort != 8081 || s.DebugPort != 6070 {
		t.Errorf("ports = %d/%d/%d, want 8080/8081/6070", s.Port, s.GRPCPort, s.DebugPort)
	}
	if s.Backend() != "memory" {
		t.Errorf("Backend() = %q without REDIS_URL, want memory", s.Backend())
	}
	if s.ConfigDir() != "/srv/runtime_data/current/config" {
		t.Errorf("ConfigDir() = %q", s.ConfigDir())
	}
	if s.Redis.Timeout != time.Second || s.Redis.PoolSize != 10 {
		t.Errorf("redis defaults = %v/%d", s.Redis.Timeout, s.Redis.PoolSize)
	}
}

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		wantErr string // "" for success
		check   func(Settings) bool
	}{
		{"redis by default with REDIS_URL", map[string]string{"REDIS_URL": "127.0.0.1:6379"}, "", func(s Settings) bool { return s.Backend() == "redis" }},
		{"explicit memory wins", map[string]string{"REDIS_URL": "x:1", "BACKEND_TYPE": "memory"}, "", func(s Settings) bool { return s.Backend() == "memory" }},
		{"per-second twin", map[string]string{"REDIS_URL": "a:1", "REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "b:2", "REDIS_PERSECOND_POOL_SIZE": "3"}, "",
			func(s Settings) bool {
				return s.RedisPerSecondConfig.URL == "b:2" && s.RedisPerSecondConfig.PoolSize == 3
			}},
		{"config dir", map[string]string{"RUNTIME_ROOT": "/data/", "RUNTIME_SUBDIRECTORY": "rl", "RUNTIME_APPDIRECTORY": "cfg"}, "",
			func(s Settings) bool { return s.ConfigDir() == "/data/rl/cfg" }},
		{"bad port", map[string]string{"PORT": "http"}, `PORT: invalid value "http": want int`, nil},
		{"port range", map[string]string{"GRPC_PORT": "70000"}, "GRPC_PORT: port 70000 out of range", nil},
		{"bad bool", map[string]string{"SHADOW_MODE": "maybe"}, `SHADOW_MODE: invalid value "maybe": want bool`, nil},
		{"bad duration", map[string]string{"REDIS_TIMEOUT": "soon"}, `REDIS_TIMEOUT: invalid value "soon"`, nil},
		{"bad backend", map[string]string{"BACKEND_TYPE": "etcd"}, `BACKEND_TYPE: unknown backend "etcd"`, nil},
		{"redis without url takes the reference's socket", map[string]string{"BACKEND_TYPE": "redis"}, "",
			func(s Settings) bool {
				return s.Redis.URL == "/var/run/nutcracker/ratelimit.sock" && s.Redis.SocketType == "unix"
			}},
		{"memcache without servers", map[string]string{"BACKEND_TYPE": "memcache"}, "MEMCACHE_HOST_PORT: or MEMCACHE_SRV is required with BACKEND_TYPE=memcache", nil},
		{"memcache with both", map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "127.0.0.1:11211", "MEMCACHE_SRV": "_m._tcp.x"}, "MEMCACHE_HOST_PORT: and MEMCACHE_SRV are both set", nil},
		{"memcache bad address", map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "127.0.0.1:11211,localhost"}, `MEMCACHE_HOST_PORT: "localhost": want host:port`, nil},
		{"memcache bad SRV", map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_SRV": "memcache.local"}, `MEMCACHE_SRV: "memcache.local": want _service._proto.name`, nil},
		{"reference spellings", map[string]string{"REDIS_URL": "a:1", "REDIS_TYPE": "SINGLE", "REDIS_SOCKET_TYPE": "TCP", "CONFIG_TYPE": "grpc_xds_sotw", "LOG_LEVEL": "Info"}, "",
			func(s Settings) bool { return s.Redis.Type == "single" && s.Redis.SocketType == "tcp" }},
		{"socket path infers unix", map[string]string{"REDIS_URL": "/run/redis.sock"}, "",
			func(s Settings) bool { return s.Redis.SocketType == "unix" }},
		{"a port that is no number names REDIS_URL", map[string]string{"REDIS_URL": "localhost:notaport"},
			`REDIS_URL: "localhost:notaport": port "notaport" is not a port number (a Unix socket is a path`, nil},
		{"a host without a port names REDIS_URL", map[string]string{"REDIS_URL": "redis"}, `REDIS_URL: "redis": want host:port`, nil},
		{"host:port infers tcp", map[string]string{"REDIS_URL": "redis.svc:6379"}, "",
			func(s Settings) bool { return s.Redis.SocketType == "tcp" }},
		{"cluster stays tcp", map[string]string{"REDIS_URL": "a:1,b:2", "REDIS_TYPE": "Cluster"}, "",
			func(s Settings) bool { return s.Redis.Type == "cluster" && s.Redis.SocketType == "tcp" }},
		{"per-second TLS files default to the main ones", map[string]string{"REDIS_URL": "a:1", "REDIS_TLS_CACERT": "ca.pem", "REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "b:2", "REDIS_PERSECOND_TLS": "true"}, "",
			func(s Settings) bool { return s.RedisPerSecondConfig.TLSCACert == "ca.pem" }},
		{"connection age as the reference", nil, "",
			func(s Settings) bool {
				return s.GRPCMaxConnectionAge == 24*time.Hour && s.GRPCMaxConnectionAgeGrace == time.Hour
			}},
		{"statsd on over tcp by default", nil, "", func(s Settings) bool { return s.UseStatsd && s.StatsdProtocol == "tcp" }},
		{"bad statsd protocol", map[string]string{"STATSD_PROTOCOL": "quic"}, `STATSD_PROTOCOL: unknown protocol "quic"`, nil},
		{"pool on empty", map[string]string{"REDIS_URL": "a:1", "REDIS_POOL_ON_EMPTY_BEHAVIOR": "wait", "REDIS_POOL_ON_EMPTY_WAIT_DURATION": "20ms"}, "",
			func(s Settings) bool {
				return s.Redis.PoolOnEmptyBehavior == "WAIT" && s.Redis.PoolOnEmptyWaitDuration == 20*time.Millisecond
			}},
		{"bad pool on empty", map[string]string{"REDIS_URL": "a:1", "REDIS_POOL_ON_EMPTY_BEHAVIOR": "grow"}, `REDIS_POOL_ON_EMPTY_BEHAVIOR: unknown behavior "GROW"`, nil},
		{"xds metadata either separator", map[string]string{"CONFIG_GRPC_XDS_NODE_METADATA": "zone:a, tier=gold"}, "",
			func(s Settings) bool { m := s.XDSMetadata(); return m["zone"] == "a" && m["tier"] == "gold" }},
		{"bad xds headers", map[string]string{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "x-token"}, `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: "x-token" is not key:value`, nil},
		{"bad xds backoff", map[string]string{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "20s", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "5s"}, "XDS_CLIENT_BACKOFF_MAX_INTERVAL: must be at least", nil},
		{"bad xds random factor", map[string]string{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "1.5"}, "XDS_CLIENT_BACKOFF_RANDOM_FACTOR: must be in [0, 1]", nil},
		{"bad redis type", map[string]string{"REDIS_URL": "x:1", "REDIS_TYPE": "ring"}, `REDIS_TYPE: unknown type "ring"`, nil},
		{"sentinel url", map[string]string{"REDIS_URL": "onlymaster", "REDIS_TYPE": "sentinel"}, "REDIS_URL: sentinel wants master-name,host:port", nil},
		{"prefix braces", map[string]string{"CACHE_KEY_PREFIX": "a{b}"}, "CACHE_KEY_PREFIX: must not contain { or }", nil},
		{"bad log level", map[string]string{"LOG_LEVEL": "loud"}, `LOG_LEVEL: unknown level "loud"`, nil},
		{"bad tracing protocol", map[string]string{"TRACING_EXPORTER_PROTOCOL": "udp"}, `TRACING_EXPORTER_PROTOCOL: unknown protocol "udp"`, nil},
		{"bad sampling rate", map[string]string{"TRACING_SAMPLING_RATE": "2"}, "TRACING_SAMPLING_RATE: must be in [0, 1]", nil},
		{"bad near limit ratio", map[string]string{"NEAR_LIMIT_RATIO": "0"}, "NEAR_LIMIT_RATIO: must be in (0, 1]", nil},
		{"bad extra tags", map[string]string{"EXTRA_TAGS": "a:1,b"}, `EXTRA_TAGS: "b" is not key:value`, nil},
		{"bad lease interval", map[string]string{"LEASE_INTERVAL": "-1s"}, "LEASE_INTERVAL: must be from 0 (off) to 10s, got -1s", nil},
		{"bad lease idle", map[string]string{"LEASE_IDLE": "1ms"}, "LEASE_IDLE: must be from 10ms to 1h, got 1ms", nil},
		{"extra tags", map[string]string{"EXTRA_TAGS": "env:prod, team:rl"}, "", func(s Settings) bool { return s.Tags()["team"] == "rl" && len(s.Tags()) == 2 }},
		{"bad failure policy", map[string]string{"BACKEND_FAILURE_POLICY": "retry"}, `BACKEND_FAILURE_POLICY: unknown policy "retry"`, nil},
		{"negative pipeline window", map[string]string{"REDIS_URL": "a:1", "REDIS_PIPELINE_WINDOW": "-1ms"}, "REDIS_PIPELINE_WINDOW: must not be negative", nil},
		{"negative per-second pipeline limit", map[string]string{"REDIS_URL": "a:1", "REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "b:2", "REDIS_PERSECOND_PIPELINE_LIMIT": "-3"}, "REDIS_PERSECOND_PIPELINE_LIMIT: must not be negative", nil},
		{"zero batches in flight", map[string]string{"REDIS_URL": "a:1", "REDIS_PIPELINE_MAX_IN_FLIGHT": "0"}, "REDIS_PIPELINE_MAX_IN_FLIGHT: must be at least 1, got 0", nil},
		{"batches in flight", map[string]string{"REDIS_URL": "a:1", "REDIS_PIPELINE_MAX_IN_FLIGHT": "2"}, "", func(s Settings) bool { return s.Redis.PipelineMaxInFlight == 2 }},
		{"batching on by default", map[string]string{"REDIS_URL": "a:1"}, "", func(s Settings) bool { return s.Redis.PipelineWindow > 0 }},
		{"bad config type", map[string]string{"CONFIG_TYPE": "CONSUL"}, `CONFIG_TYPE: unknown type "CONSUL"`, nil},
		{"debug port on loopback by default", nil, "", func(s Settings) bool { return s.DebugHost == "127.0.0.1" }},
		{"json on without mTLS", nil, "", func(s Settings) bool { return s.JSONEndpoint() }},
		{"json off under mTLS", map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c", "GRPC_SERVER_TLS_KEY": "k", "GRPC_CLIENT_TLS_CACERT": "ca"}, "",
			func(s Settings) bool { return !s.JSONEndpoint() }},
		{"json under mTLS when asked", map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "c", "GRPC_SERVER_TLS_KEY": "k", "GRPC_CLIENT_TLS_CACERT": "ca", "JSON_ENDPOINT_ENABLED": "true"}, "",
			func(s Settings) bool { return s.JSONEndpoint() }},
		{"json off when asked", map[string]string{"JSON_ENDPOINT_ENABLED": "false"}, "", func(s Settings) bool { return !s.JSONEndpoint() }},
		{"request bytes", map[string]string{"REQUEST_MAX_BYTES": "0"}, "REQUEST_MAX_BYTES: must be at least 1, got 0", nil},
		{"concurrent streams", map[string]string{"GRPC_MAX_CONCURRENT_STREAMS": "-1"}, "GRPC_MAX_CONCURRENT_STREAMS: must be at least 1, got -1", nil},
		{"request bytes in flight under one request", map[string]string{"GRPC_MAX_REQUEST_BYTES_IN_FLIGHT": "1000"},
			"GRPC_MAX_REQUEST_BYTES_IN_FLIGHT: must be at least REQUEST_MAX_BYTES (262144), or a request of that size is never served; got 1000", nil},
		{"request bytes in flight", map[string]string{"REQUEST_MAX_BYTES": "1000", "GRPC_MAX_REQUEST_BYTES_IN_FLIGHT": "1000"}, "",
			func(s Settings) bool { return s.ServerOptions().MaxRequestBytesInFlight == 1000 }},
		{"every unparsable variable at once", map[string]string{"PORT": "eighty", "GRPC_PORT": "x", "REDIS_TIMEOUT": "soon", "SHADOW_MODE": "maybe"},
			"PORT: invalid value \"eighty\": want int\nGRPC_PORT: invalid value \"x\": want int\nSHADOW_MODE: invalid value \"maybe\": want bool\nREDIS_TIMEOUT: invalid value \"soon\": want a duration such as 500ms, 10s or 1h", nil},
		{"RLQS TTL in whole seconds", map[string]string{"RLQS_ASSIGNMENT_TTL": "4500ms"},
			"RLQS_ASSIGNMENT_TTL: must be a whole number of seconds, at least 1s (Envoy reads whole seconds only), got 4.5s", nil},
		{"RLQS TTL past a renewal", map[string]string{"RLQS_ASSIGNMENT_TTL": "2s"},
			"RLQS_ASSIGNMENT_TTL: must exceed RLQS_PUSH_INTERVAL plus RLQS_DELIVERY_BOUND (2s)", nil},
		{"RLQS bounds", map[string]string{"RLQS_MAX_STREAMS": "0", "RLQS_IDLE_ABANDON": "-1s"},
			"RLQS_IDLE_ABANDON: must be positive, got -1s\nRLQS_MAX_STREAMS: must be at least 1, got 0", nil},
		{"RLQS settings reach the service", map[string]string{"RLQS_ASSIGNMENT_TTL": "10s", "RLQS_SHARED_COUNTERS": "true"}, "",
			func(s Settings) bool {
				return s.RLQSOptions().TTL == 10*time.Second && s.ServiceOptions().SharedWindows
			}},
		{"shared counters need RLQS", map[string]string{"RLQS_SHARED_COUNTERS": "true", "RLQS_ENABLED": "false"}, "",
			func(s Settings) bool { return !s.ServiceOptions().SharedWindows }},
		{"two problems at once", map[string]string{"LOG_FORMAT": "xml", "MEMORY_MAX_KEYS": "0"}, "LOG_FORMAT: unknown format \"xml\" (want text or json)\nMEMORY_MAX_KEYS: must be at least 1", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			s, err := Load()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Load() error: %v", err)
				}
				if !tc.check(s) {
					t.Errorf("Load() = %+v, check failed", s)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Load() error = %v, want one containing %q", err, tc.wantErr)
			}
			// Each fact once: no setting is named twice in one error.
			if err != nil {
				for _, name := range Names() {
					if len(regexp.MustCompile(`(^|[^A-Z_])`+name+`:`).FindAllString(err.Error(), -1)) > 1 {
						t.Errorf("Load() error = %v: %s is named twice", err, name)
					}
				}
			}
		})
	}
}

func TestNames(t *testing.T) {
	names := strings.Join(Names(), " ")
	for _, want := range []string{"GRPC_PORT", "REDIS_URL", "REDIS_PERSECOND_URL", "RUNTIME_WATCH_ROOT", "CACHE_KEY_PREFIX"} {
		if !strings.Contains(" "+names+" ", " "+want+" ") {
			t.Errorf("Names() lacks %s", want)
		}
	}
}

func TestWarningsAndFlushAliases(t *testing.T) {
	t.Setenv("REDIS_STARTUP_MAX_INTERVAL", "true")
	t.Setenv("REDIS_POOL_ON_EMPTY_BEHAVIOR", "create")
	t.Setenv("GOSTATS_FLUSH_INTERVAL_SECONDS", "3")
	t.Setenv("PROMETHEUS_MAPPER_YAML", "") // empty: asks for nothing, no warning
	got := Warnings()
	want := []string{"REDIS_POOL_ON_EMPTY_BEHAVIOR=CREATE:", "REDIS_STARTUP_MAX_INTERVAL: ignored:"}
	if len(got) != len(want) {
		t.Fatalf("Warnings() = %q, want %d lines", got, len(want))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("Warnings()[%d] = %q, want it to start with %q", i, got[i], want[i])
		}
	}
	s, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if s.StatsFlushInterval != 3*time.Second {
		t.Errorf("StatsFlushInterval = %v, want 3s from GOSTATS_FLUSH_INTERVAL_SECONDS", s.StatsFlushInterval)
	}
	t.Setenv("STATS_FLUSH_INTERVAL", "7s")
	if s, _ = Load(); s.StatsFlushInterval != 7*time.Second {
		t.Errorf("StatsFlushInterval = %v, want STATS_FLUSH_INTERVAL's 7s to win", s.StatsFlushInterval)
	}
}

// TestEveryBadSettingAtOnce: a variable that does not parse and one that
// parses but is wrong are both named in one run, and the environment is
// as it was after.
func TestEveryBadSettingAtOnce(t *testing.T) {
	t.Setenv("REDIS_URL", "a:1")
	t.Setenv("REDIS_TIMEOUT", "abc")
	t.Setenv("GRPC_PORT", "x")
	t.Setenv("BACKEND_FAILURE_POLICY", "maybe")
	_, err := Load()
	if err == nil {
		t.Fatal("Load() succeeded")
	}
	for _, want := range []string{`REDIS_TIMEOUT: invalid value "abc"`, `GRPC_PORT: invalid value "x"`, "BACKEND_FAILURE_POLICY:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Load() = %v, want it to name %s", err, want)
		}
	}
	if got := os.Getenv("REDIS_TIMEOUT"); got != "abc" {
		t.Errorf("REDIS_TIMEOUT = %q after Load, want it restored", got)
	}
}
