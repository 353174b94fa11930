// Package settings reads the service's environment once, into one struct,
// with the variable names of envoyproxy/ratelimit wherever the concept
// exists. No other package reads the environment: cmd/server projects
// Settings into each package's Options.
package settings

import (
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/sirupsen/logrus"

	"github.com/openrls/ratelimit/src/config"
)

// Settings is the whole environment. Field docs give the default.
type Settings struct {
	// Listeners.
	Host     string `envconfig:"HOST" default:"0.0.0.0"`
	Port     int    `envconfig:"PORT" default:"8080"`
	GRPCHost string `envconfig:"GRPC_HOST" default:"0.0.0.0"`
	GRPCPort int    `envconfig:"GRPC_PORT" default:"8081"`
	// GRPCUDS, when set, serves gRPC on this Unix socket path instead of
	// GRPC_HOST:GRPC_PORT.
	GRPCUDS string `envconfig:"GRPC_UDS"`
	// DebugHost is loopback by default (the reference binds every
	// interface): the debug port serves pprof and the config.
	DebugHost string `envconfig:"DEBUG_HOST" default:"127.0.0.1"`
	DebugPort int    `envconfig:"DEBUG_PORT" default:"6070"`
	// gRPC server TLS and mTLS; files are re-read when they change.
	GRPCServerUseTLS    bool   `envconfig:"GRPC_SERVER_USE_TLS" default:"false"`
	GRPCServerTLSCert   string `envconfig:"GRPC_SERVER_TLS_CERT"`
	GRPCServerTLSKey    string `envconfig:"GRPC_SERVER_TLS_KEY"`
	GRPCClientTLSCACert string `envconfig:"GRPC_CLIENT_TLS_CACERT"`
	GRPCClientTLSSAN    string `envconfig:"GRPC_CLIENT_TLS_SAN"`
	// GRPCMaxConnectionAge closes client connections after this age (with
	// GOAWAY, grpc-go adding +/-10% jitter) so that clients re-resolve and
	// spread over new replicas; the grace is how long calls in flight then
	// get. 0 means never.
	GRPCMaxConnectionAge      time.Duration `envconfig:"GRPC_MAX_CONNECTION_AGE" default:"24h"`
	GRPCMaxConnectionAgeGrace time.Duration `envconfig:"GRPC_MAX_CONNECTION_AGE_GRACE" default:"1h"`
	// GRPCMaxConcurrentStreams bounds the calls in flight on one gRPC
	// connection (ours).
	GRPCMaxConcurrentStreams int `envconfig:"GRPC_MAX_CONCURRENT_STREAMS" default:"1000"`
	// Guards against one client taking the gRPC listener (ours): open
	// connections, calls in flight across them, how long a connection may
	// sit without calls, and how long an answer may wait for the client to
	// read it before its connection is closed.
	GRPCMaxConnections           int `envconfig:"GRPC_MAX_CONNECTIONS" default:"10000"`
	GRPCMaxConnectionsPerAddress int `envconfig:"GRPC_MAX_CONNECTIONS_PER_ADDRESS" default:"1000"`
	// HTTPMaxConnections and HTTPMaxConnectionsPerAddress cap each HTTP
	// listener (the HTTP port, the debug port, PROMETHEUS_ADDR); an idle
	// keep-alive connection gives way to a new one.
	HTTPMaxConnections           int           `envconfig:"HTTP_MAX_CONNECTIONS" default:"1024"`
	HTTPMaxConnectionsPerAddress int           `envconfig:"HTTP_MAX_CONNECTIONS_PER_ADDRESS" default:"256"`
	GRPCMaxCallsInFlight         int           `envconfig:"GRPC_MAX_CALLS_IN_FLIGHT" default:"10000"`
	GRPCMaxConnectionIdle        time.Duration `envconfig:"GRPC_MAX_CONNECTION_IDLE" default:"15m"`
	GRPCStreamWriteTimeout       time.Duration `envconfig:"GRPC_STREAM_WRITE_TIMEOUT" default:"30s"`
	GRPCMaxResetsPerSecond       int           `envconfig:"GRPC_MAX_RESETS_PER_SECOND" default:"200"`
	// GRPCAbuseCooldown refuses new connections from an address for this
	// long after one of its connections was closed for abuse (0: never).
	GRPCAbuseCooldown time.Duration `envconfig:"GRPC_ABUSE_COOLDOWN" default:"10s"`
	// JSONEndpointEnabled serves POST /json on the HTTP port. Unset: on,
	// except when gRPC requires client certificates, since the HTTP port
	// has none and would let any client around them.
	JSONEndpointEnabled *bool `envconfig:"JSON_ENDPOINT_ENABLED"`

	// Config files: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY/*.yaml.
	RuntimeRoot           string `envconfig:"RUNTIME_ROOT" default:"/srv/runtime_data/current"`
	RuntimeSubdirectory   string `envconfig:"RUNTIME_SUBDIRECTORY"`
	RuntimeAppDirectory   string `envconfig:"RUNTIME_APPDIRECTORY" default:"config"`
	RuntimeIgnoreDotFiles bool   `envconfig:"RUNTIME_IGNOREDOTFILES" default:"false"`
	MergeDomainConfig     bool   `envconfig:"MERGE_DOMAIN_CONFIG" default:"false"`
	// WildcardPrecedence picks among wildcard values of one key that all
	// match: "first" in the config (as the reference) or "most_literal".
	WildcardPrecedence string `envconfig:"WILDCARD_PRECEDENCE" default:"first"`
	// RuntimeWatchRoot also watches RUNTIME_ROOT's parent, so that swapping
	// the root symlink reloads the config.
	RuntimeWatchRoot bool `envconfig:"RUNTIME_WATCH_ROOT" default:"true"`
	// ForceStartWithoutInitialConfig starts serving even when the config
	// cannot be loaded; requests then get Unavailable.
	ForceStartWithoutInitialConfig bool `envconfig:"FORCE_START_WITHOUT_INITIAL_CONFIG" default:"false"`
	// HealthyWithAtLeastOneConfigLoaded keeps /healthcheck failing until a
	// config with at least one domain is being served.
	HealthyWithAtLeastOneConfigLoaded bool `envconfig:"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED" default:"false"`

	// ConfigType is FILE or GRPC_XDS_SOTW.
	ConfigType              string        `envconfig:"CONFIG_TYPE" default:"FILE"`
	XDSServerURL            string        `envconfig:"CONFIG_GRPC_XDS_SERVER_URL" default:"localhost:18000"`
	XDSNodeID               string        `envconfig:"CONFIG_GRPC_XDS_NODE_ID" default:"default"`
	XDSConnectRetryInterval time.Duration `envconfig:"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL" default:"3s"`
	// XDSNodeMetadata is the node's metadata, "k1:v1,k2=v2" (either
	// separator, as the reference reads it).
	XDSNodeMetadata string `envconfig:"CONFIG_GRPC_XDS_NODE_METADATA"`
	// XDSAdditionalHeaders are gRPC metadata sent on the xDS stream,
	// "k1:v1,k2:v2".
	XDSAdditionalHeaders string `envconfig:"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"`
	// The xDS stream's reconnect backoff: the first wait, the most, the
	// random share of each wait (0.5: +/-50%), and whether to randomise.
	XDSBackoffInitial      time.Duration `envconfig:"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL" default:"10s"`
	XDSBackoffMax          time.Duration `envconfig:"XDS_CLIENT_BACKOFF_MAX_INTERVAL" default:"60s"`
	XDSBackoffRandomFactor float64       `envconfig:"XDS_CLIENT_BACKOFF_RANDOM_FACTOR" default:"0.5"`
	XDSBackoffJitter       bool          `envconfig:"XDS_CLIENT_BACKOFF_JITTER" default:"true"`
	// XDSMaxMsgSize bounds one xDS response (0: gRPC's 4 MiB).
	XDSMaxMsgSize int `envconfig:"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES" default:"0"`
	// TLS to the xDS server: CA of its certificate, optional client
	// certificate, optional name to verify instead of the URL's host.
	XDSServerUseTLS  bool   `envconfig:"CONFIG_GRPC_XDS_SERVER_USE_TLS" default:"false"`
	XDSServerTLSCA   string `envconfig:"CONFIG_GRPC_XDS_SERVER_TLS_CACERT"`
	XDSClientTLSCert string `envconfig:"CONFIG_GRPC_XDS_CLIENT_TLS_CERT"`
	XDSClientTLSKey  string `envconfig:"CONFIG_GRPC_XDS_CLIENT_TLS_KEY"`
	XDSServerTLSSAN  string `envconfig:"CONFIG_GRPC_XDS_SERVER_TLS_SAN"`

	LogLevel  string `envconfig:"LOG_LEVEL" default:"WARN"`
	LogFormat string `envconfig:"LOG_FORMAT" default:"text"`

	// Request size limits (answered InvalidArgument beyond them).
	RequestMaxDescriptors int `envconfig:"REQUEST_MAX_DESCRIPTORS" default:"64"`
	RequestMaxEntries     int `envconfig:"REQUEST_MAX_ENTRIES" default:"32"`
	RequestMaxStringBytes int `envconfig:"REQUEST_MAX_STRING_BYTES" default:"4096"`
	// RequestMaxBytes bounds one gRPC request message (ours).
	RequestMaxBytes int `envconfig:"REQUEST_MAX_BYTES" default:"262144"`
	// RequestMaxHits bounds a descriptor's hits_addend; RequestMaxKeys the
	// limits (store keys) one request's descriptors match, summed (ours).
	RequestMaxHits uint64 `envconfig:"REQUEST_MAX_HITS" default:"1099511627776"`
	RequestMaxKeys int    `envconfig:"REQUEST_MAX_KEYS" default:"256"`

	// Decisions.
	ShadowMode bool `envconfig:"SHADOW_MODE" default:"false"`
	// QuotaMode treats every descriptor as quota_mode: a limit past its
	// budget is reported, and only rejects the request when every limited
	// descriptor is past its budget (as the reference's quota mode).
	QuotaMode                          bool `envconfig:"QUOTA_MODE" default:"false"`
	StopCacheKeyIncrementWhenOverlimit bool `envconfig:"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT" default:"false"`

	// BackendFailurePolicy answers descriptors without their own
	// failure_policy when the store fails: error, allow, deny or local.
	BackendFailurePolicy string `envconfig:"BACKEND_FAILURE_POLICY" default:"error"`
	// CircuitBreakerFailures in a row open the Redis circuit breaker (0: no
	// breaker); CircuitBreakerProbeInterval paces its probes while open.
	CircuitBreakerFailures      int           `envconfig:"CIRCUIT_BREAKER_FAILURES" default:"5"`
	CircuitBreakerProbeInterval time.Duration `envconfig:"CIRCUIT_BREAKER_PROBE_INTERVAL" default:"500ms"`

	// Backend: "memory" or "redis"; empty means redis when REDIS_URL is set,
	// else memory.
	BackendType string `envconfig:"BACKEND_TYPE"`
	// MemoryMaxKeys bounds the embedded store (our own setting).
	MemoryMaxKeys int `envconfig:"MEMORY_MAX_KEYS" default:"1048576"`
	// MemoryMaxBytes bounds the bytes its counters hold (sliding logs
	// count by their entries); 256 MiB.
	MemoryMaxBytes int64 `envconfig:"MEMORY_MAX_BYTES" default:"268435456"`

	// Observability.
	NearLimitRatio          float64 `envconfig:"NEAR_LIMIT_RATIO" default:"0.8"`
	MaxDetailedMetricSeries int     `envconfig:"MAX_DETAILED_METRIC_SERIES" default:"1000"`
	UsePrometheus           bool    `envconfig:"USE_PROMETHEUS" default:"false"`
	PrometheusAddr          string  `envconfig:"PROMETHEUS_ADDR" default:":9090"`
	PrometheusPath          string  `envconfig:"PROMETHEUS_PATH" default:"/metrics"`
	// PrometheusResponseTimeAsMilliseconds reports the reference's
	// ratelimit_service_response_time_seconds histogram in milliseconds.
	PrometheusResponseTimeAsMilliseconds bool   `envconfig:"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS" default:"false"`
	UseStatsd                            bool   `envconfig:"USE_STATSD" default:"true"`
	StatsdHost                           string `envconfig:"STATSD_HOST" default:"localhost"`
	StatsdPort                           int    `envconfig:"STATSD_PORT" default:"8125"`
	// StatsdProtocol is tcp, as the reference sends, or udp (ours).
	StatsdProtocol     string        `envconfig:"STATSD_PROTOCOL" default:"tcp"`
	StatsFlushInterval time.Duration `envconfig:"STATS_FLUSH_INTERVAL" default:"10s"`
	// StatsdFlushInterval and GostatsFlushIntervalSeconds are older names of
	// the flush period, used only while STATS_FLUSH_INTERVAL is unset.
	StatsdFlushInterval         time.Duration `envconfig:"STATSD_FLUSH_INTERVAL" default:"0"`
	GostatsFlushIntervalSeconds int           `envconfig:"GOSTATS_FLUSH_INTERVAL_SECONDS" default:"0"`
	// DisableStats sends no statsd and serves none of the reference's
	// series on PROMETHEUS_ADDR; /metrics on the HTTP port stays.
	DisableStats bool   `envconfig:"DISABLE_STATS" default:"false"`
	ExtraTags    string `envconfig:"EXTRA_TAGS"`
	// Tracing (OpenTelemetry, OTLP; endpoint from OTEL_EXPORTER_OTLP_*).
	TracingEnabled           bool    `envconfig:"TRACING_ENABLED" default:"false"`
	TracingExporterProtocol  string  `envconfig:"TRACING_EXPORTER_PROTOCOL" default:"http"`
	TracingServiceName       string  `envconfig:"TRACING_SERVICE_NAME" default:"RateLimit"`
	TracingServiceNamespace  string  `envconfig:"TRACING_SERVICE_NAMESPACE"`
	TracingServiceInstanceID string  `envconfig:"TRACING_SERVICE_INSTANCE_ID"`
	TracingSamplingRate      float64 `envconfig:"TRACING_SAMPLING_RATE" default:"1"`
	// Response decorations.
	LimitResponseHeadersEnabled bool   `envconfig:"LIMIT_RESPONSE_HEADERS_ENABLED" default:"false"`
	LimitLimitHeader            string `envconfig:"LIMIT_LIMIT_HEADER" default:"RateLimit-Limit"`
	LimitRemainingHeader        string `envconfig:"LIMIT_REMAINING_HEADER" default:"RateLimit-Remaining"`
	LimitResetHeader            string `envconfig:"LIMIT_RESET_HEADER" default:"RateLimit-Reset"`
	ResponseDynamicMetadata     bool   `envconfig:"RESPONSE_DYNAMIC_METADATA" default:"false"`
	// ResponseDynamicMetadataRules adds what decided each descriptor to the
	// dynamic metadata: rule, source, match, limit (ours).
	ResponseDynamicMetadataRules bool `envconfig:"RESPONSE_DYNAMIC_METADATA_RULES" default:"false"`
	// Who is limited most (ours): counters kept per window (0: off), the
	// window, and how many of the top to export as Prometheus series (0:
	// none; they carry request values, hashed where keys hash them).
	TopLimitedSize   int           `envconfig:"TOP_LIMITED_SIZE" default:"1024"`
	TopLimitedWindow time.Duration `envconfig:"TOP_LIMITED_WINDOW" default:"5m"`
	TopLimitedMetric int           `envconfig:"TOP_LIMITED_METRIC" default:"0"`

	Redis          Redis `ignored:"true"`
	RedisPerSecond bool  `envconfig:"REDIS_PERSECOND" default:"false"`
	// RedisPerSecondConfig is the REDIS_PERSECOND_* twin, used when
	// RedisPerSecond is set.
	RedisPerSecondConfig Redis  `ignored:"true"`
	CacheKeyPrefix       string `envconfig:"CACHE_KEY_PREFIX"`
	// CacheKeyHashValues writes descriptor values hashed in counter keys.
	CacheKeyHashValues bool `envconfig:"CACHE_KEY_HASH_VALUES" default:"false"`
	// LocalCacheSizeInBytes sizes the local over-limit cache (0: off).
	LocalCacheSizeInBytes int `envconfig:"LOCAL_CACHE_SIZE_IN_BYTES" default:"0"`
	// Leased budgets for limits with lease: true (ours): how long a slice
	// should last at a replica's recent rate (0: every hit is decided in
	// Redis), and how long an unused slice is kept before it goes back.
	LeaseInterval time.Duration `envconfig:"LEASE_INTERVAL" default:"50ms"`
	LeaseIdle     time.Duration `envconfig:"LEASE_IDLE" default:"1s"`
}

// Redis is one Redis connection's settings; the REDIS_ and
// REDIS_PERSECOND_ groups share this shape.
type Redis struct {
	URL string `envconfig:"URL"`
	// Type and SocketType are read case-insensitively, as the reference
	// reads them ("SINGLE" is its default's spelling). SocketType unset:
	// unix for a URL that is a path, else tcp.
	Type                  string `envconfig:"TYPE" default:"single"`
	SocketType            string `envconfig:"SOCKET_TYPE"`
	Auth                  string `envconfig:"AUTH"`
	SentinelAuth          string `envconfig:"SENTINEL_AUTH"`
	TLS                   bool   `envconfig:"TLS" default:"false"`
	TLSCACert             string `envconfig:"TLS_CACERT"`
	TLSClientCert         string `envconfig:"TLS_CLIENT_CERT"`
	TLSClientKey          string `envconfig:"TLS_CLIENT_KEY"`
	TLSSkipHostnameVerify bool   `envconfig:"TLS_SKIP_HOSTNAME_VERIFICATION" default:"false"`
	PoolSize              int    `envconfig:"POOL_SIZE" default:"10"`
	// PoolOnEmptyBehavior is what a call does when every pooled connection
	// is busy: WAIT or ERROR wait up to PoolOnEmptyWaitDuration for one
	// (then fail); CREATE (the reference's default) is not supported by
	// go-redis, whose pool never grows past PoolSize, and waits up to
	// TIMEOUT.
	PoolOnEmptyBehavior         string        `envconfig:"POOL_ON_EMPTY_BEHAVIOR" default:"WAIT"`
	PoolOnEmptyWaitDuration     time.Duration `envconfig:"POOL_ON_EMPTY_WAIT_DURATION" default:"1s"`
	Timeout                     time.Duration `envconfig:"TIMEOUT" default:"1s"`
	PipelineWindow              time.Duration `envconfig:"PIPELINE_WINDOW" default:"150us"`
	PipelineLimit               int           `envconfig:"PIPELINE_LIMIT" default:"0"`
	PipelineMaxInFlight         int           `envconfig:"PIPELINE_MAX_IN_FLIGHT" default:"2"`
	HealthCheckActiveConnection bool          `envconfig:"HEALTH_CHECK_ACTIVE_CONNECTION" default:"false"`
}

// Load reads the environment and validates it. The error names every bad
// variable.
func Load() (Settings, error) {
	var s Settings
	for _, p := range []struct {
		prefix string
		dst    any
	}{{"", &s}, {"REDIS", &s.Redis}, {"REDIS_PERSECOND", &s.RedisPerSecondConfig}} {
		if err := envconfig.Process(p.prefix, p.dst); err != nil {
			// envconfig stops at the first bad variable: name them all,
			// and what is wrong with the others too.
			bad, all := parseErrors()
			if all == nil {
				return s, cleanEnvconfigError(err)
			}
			return s, errors.Join(all, validateWithout(bad))
		}
	}
	s.normalize()
	return s, s.Validate()
}

// validateWithout validates the settings as if the variables named were
// not set (they did not parse, and are reported already), so that one run
// names every bad variable. It runs at start-up, before anything else reads
// the environment, which it restores.
func validateWithout(names []string) error {
	saved := map[string]string{}
	for _, n := range names {
		saved[n] = os.Getenv(n)
		_ = os.Unsetenv(n)
	}
	defer func() {
		for n, v := range saved {
			_ = os.Setenv(n, v)
		}
	}()
	if _, err := Load(); err != nil {
		return err
	}
	return nil
}

// referenceRedisURL and referenceRedisPerSecondURL are the reference's
// defaults (a twemproxy socket), used when BACKEND_TYPE=redis is set
// without a URL, as the reference uses them.
const (
	referenceRedisURL          = "/var/run/nutcracker/ratelimit.sock"
	referenceRedisPerSecondURL = "/var/run/nutcracker/ratelimitpersecond.sock"
)

// normalize applies what depends on other variables: the older names of
// the flush period, the reference's case-insensitive enums, the socket type
// inferred from the URL, the reference's Redis URL defaults, and the
// per-second Redis's TLS files defaulting to the main ones (the reference
// has one set of TLS files for both).
func (s *Settings) normalize() {
	if _, set := os.LookupEnv("STATS_FLUSH_INTERVAL"); !set {
		switch {
		case s.GostatsFlushIntervalSeconds > 0:
			s.StatsFlushInterval = time.Duration(s.GostatsFlushIntervalSeconds) * time.Second
		case s.StatsdFlushInterval > 0:
			s.StatsFlushInterval = s.StatsdFlushInterval
		}
	}
	s.StatsdProtocol = strings.ToLower(s.StatsdProtocol)
	if strings.EqualFold(s.BackendType, "redis") {
		if s.Redis.URL == "" {
			s.Redis.URL = referenceRedisURL
		}
		if s.RedisPerSecond && s.RedisPerSecondConfig.URL == "" {
			s.RedisPerSecondConfig.URL = referenceRedisPerSecondURL
		}
	}
	s.Redis.normalize()
	s.RedisPerSecondConfig.normalize()
	ps := &s.RedisPerSecondConfig
	if ps.TLSCACert == "" && ps.TLSClientCert == "" && ps.TLSClientKey == "" {
		ps.TLSCACert, ps.TLSClientCert, ps.TLSClientKey = s.Redis.TLSCACert, s.Redis.TLSClientCert, s.Redis.TLSClientKey
		if _, set := os.LookupEnv("REDIS_PERSECOND_TLS_SKIP_HOSTNAME_VERIFICATION"); !set {
			ps.TLSSkipHostnameVerify = s.Redis.TLSSkipHostnameVerify
		}
	}
}

func (r *Redis) normalize() {
	r.Type = strings.ToLower(r.Type)
	r.SocketType = strings.ToLower(r.SocketType)
	r.PoolOnEmptyBehavior = strings.ToUpper(r.PoolOnEmptyBehavior)
	if r.SocketType == "" {
		r.SocketType = "tcp"
		if r.Type == "single" && isSocketPath(r.URL) {
			r.SocketType = "unix"
		}
	}
}

// isSocketPath tells a Unix socket path from host:port: a path has a slash
// or no port.
func isSocketPath(url string) bool {
	if strings.Contains(url, "/") {
		return true
	}
	_, port, found := strings.Cut(url, ":")
	if !found {
		return url != ""
	}
	_, err := strconv.Atoi(port)
	return err != nil
}

// ignored are envoyproxy/ratelimit variables for what this service does
// not do, with why: setting one is reported at start-up, never silently
// ignored. None of them changes a decision.
var ignored = map[string]string{
	"USE_DOG_STATSD":                          "DogStatsD is not supported: statsd lines are plain statsd, named as the reference names them",
	"USE_DOG_STATSD_MOGRIFIERS":               "DogStatsD is not supported",
	"PROMETHEUS_MAPPER_YAML":                  "a custom statsd-exporter mapping is not supported: PROMETHEUS_ADDR serves the reference's default mapping's series",
	"EXPIRATION_JITTER_MAX_SECONDS":           "counters expire when their window ends, without jitter (expiry here only collects garbage)",
	"MEMCACHE_HOST_PORT":                      "memcache is not supported (BACKEND_TYPE=memcache is refused)",
	"MEMCACHE_MAX_IDLE_CONNS":                 "memcache is not supported",
	"MEMCACHE_SRV":                            "memcache is not supported",
	"MEMCACHE_SRV_REFRESH":                    "memcache is not supported",
	"MEMCACHE_TLS":                            "memcache is not supported",
	"MEMCACHE_TLS_CLIENT_CERT":                "memcache is not supported",
	"MEMCACHE_TLS_CLIENT_KEY":                 "memcache is not supported",
	"MEMCACHE_TLS_CACERT":                     "memcache is not supported",
	"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION": "memcache is not supported",
	"REDIS_CLUSTER_PIPELINE_PARALLELISM": "batches to a Redis Cluster already go to every node at once " +
		"(REDIS_PIPELINE_MAX_IN_FLIGHT bounds them)",
	"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM": "batches to a Redis Cluster already go to every node at once " +
		"(REDIS_PERSECOND_PIPELINE_MAX_IN_FLIGHT bounds them)",
	"REDIS_STARTUP_INITIAL_INTERVAL": redisStartup,
	"REDIS_STARTUP_MAX_INTERVAL":     redisStartup,
	"REDIS_STARTUP_MAX_ELAPSED_TIME": redisStartup,
}

// redisStartup is why the reference's start-up retry settings are not read.
const redisStartup = "this service never stops or waits at start-up for Redis: it serves at once (answering by " +
	"failure policy) and connects as soon as Redis answers, retrying for as long as it runs"

// Warnings describes, one line each, the set variables of
// envoyproxy/ratelimit that this service does not honour as the reference
// does, so that start-up can say so instead of ignoring them silently.
func Warnings() []string {
	var out []string
	for _, kv := range os.Environ() {
		name, value, _ := strings.Cut(kv, "=")
		if why, ok := ignored[name]; ok {
			out = append(out, name+": ignored: "+why)
			continue
		}
		if (name == "REDIS_POOL_ON_EMPTY_BEHAVIOR" || name == "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR") &&
			strings.EqualFold(value, "CREATE") {
			out = append(out, name+"=CREATE: the pool never grows past its size here; a call waits for a free "+
				"connection up to the Redis timeout instead")
		}
	}
	sort.Strings(out)
	return out
}

// parseErrors checks every set variable against its field's type, as
// envconfig parses it, and returns the names of those that do not parse
// and one error for each, in the order of Names.
func parseErrors() (names []string, err error) {
	var errs []error
	check := func(t reflect.Type, prefix string) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name := f.Tag.Get("envconfig")
			if name == "" {
				continue
			}
			v, set := os.LookupEnv(prefix + name)
			if !set || v == "" {
				continue
			}
			if want := parses(f.Type, v); want != "" {
				names = append(names, prefix+name)
				errs = append(errs, fmt.Errorf("%s: invalid value %q: want %s", prefix+name, v, want))
			}
		}
	}
	check(reflect.TypeOf(Settings{}), "")
	check(reflect.TypeOf(Redis{}), "REDIS_")
	check(reflect.TypeOf(Redis{}), "REDIS_PERSECOND_")
	return names, errors.Join(errs...)
}

// parses returns "" if v parses as a value of type t, else the type's name
// as envconfig's errors give it.
func parses(t reflect.Type, v string) string {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var err error
	switch {
	case t == reflect.TypeOf(time.Duration(0)):
		_, err = time.ParseDuration(v)
	case t.Kind() == reflect.Bool:
		_, err = strconv.ParseBool(v)
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		_, err = strconv.ParseInt(v, 0, 64)
	case t.Kind() == reflect.Uint64:
		_, err = strconv.ParseUint(v, 0, 64)
	case t.Kind() == reflect.Float64:
		_, err = strconv.ParseFloat(v, 64)
	}
	switch {
	case err == nil:
		return ""
	case t == reflect.TypeOf(time.Duration(0)):
		return "a duration such as 500ms, 10s or 1h"
	}
	return t.String()
}

// cleanEnvconfigError turns envconfig's "envconfig.Process: assigning PORT to
// Port: converting 'x' to type int. details: ..." into "PORT: invalid value
// \"x\": ...".
func cleanEnvconfigError(err error) error {
	var pe *envconfig.ParseError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: invalid value %q: want %s", pe.KeyName, pe.Value, pe.TypeName)
	}
	return err
}

// JSONEndpoint reports whether POST /json is served, with the default
// applied: on unless gRPC requires client certificates.
func (s Settings) JSONEndpoint() bool {
	if s.JSONEndpointEnabled != nil {
		return *s.JSONEndpointEnabled
	}
	return s.GRPCClientTLSCACert == ""
}

// Backend is the store to use, with the default applied.
func (s Settings) Backend() string {
	if s.BackendType != "" {
		return strings.ToLower(s.BackendType)
	}
	if s.Redis.URL != "" {
		return "redis"
	}
	return "memory"
}

// ConfigDir is where the config files live.
func (s Settings) ConfigDir() string {
	return joinPath(s.RuntimeRoot, s.RuntimeSubdirectory, s.RuntimeAppDirectory)
}

func joinPath(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, strings.TrimSuffix(p, "/"))
		}
	}
	return strings.Join(out, "/")
}

// Validate reports every invalid setting by its variable name.
func (s Settings) Validate() error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", name, fmt.Sprintf(format, args...)))
	}
	s.validateListeners(bad)
	s.validateLogs(bad)
	s.validateConfigSource(bad)
	s.validateObservability(bad)
	s.validateStore(bad)
	s.validateLease(bad)
	s.validateRequestBounds(bad)
	return errors.Join(errs...)
}

// complaint reports one bad variable: its name, then what is wrong.
type complaint func(name, format string, args ...any)

// validateListeners checks the ports, gRPC TLS and connection lifetimes.
func (s Settings) validateListeners(bad complaint) {
	for _, p := range []struct {
		name string
		v    int
	}{{"PORT", s.Port}, {"GRPC_PORT", s.GRPCPort}, {"DEBUG_PORT", s.DebugPort}} {
		if p.v < 0 || p.v > 65535 {
			bad(p.name, "port %d out of range 0-65535", p.v)
		}
	}
	if s.GRPCServerUseTLS && (s.GRPCServerTLSCert == "" || s.GRPCServerTLSKey == "") {
		bad("GRPC_SERVER_TLS_CERT", "and GRPC_SERVER_TLS_KEY are required with GRPC_SERVER_USE_TLS=true")
	}
	if !s.GRPCServerUseTLS && s.GRPCClientTLSCACert != "" {
		bad("GRPC_CLIENT_TLS_CACERT", "needs GRPC_SERVER_USE_TLS=true")
	}
	if s.GRPCMaxConnectionAge < 0 || s.GRPCMaxConnectionAgeGrace < 0 || s.GRPCMaxConnectionIdle < 0 {
		bad("GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE and GRPC_MAX_CONNECTION_IDLE must not be negative")
	}
	if s.GRPCAbuseCooldown < 0 {
		bad("GRPC_ABUSE_COOLDOWN", "must not be negative, got %v", s.GRPCAbuseCooldown)
	}
	if s.GRPCStreamWriteTimeout <= 0 {
		bad("GRPC_STREAM_WRITE_TIMEOUT", "must be positive, got %v", s.GRPCStreamWriteTimeout)
	}
}

// validateLogs checks LOG_LEVEL and LOG_FORMAT.
func (s Settings) validateLogs(bad complaint) {
	if _, err := logrus.ParseLevel(s.LogLevel); err != nil {
		bad("LOG_LEVEL", "unknown level %q (want debug, info, warn, error)", s.LogLevel)
	}
	if f := strings.ToLower(s.LogFormat); f != "text" && f != "json" {
		bad("LOG_FORMAT", "unknown format %q (want text or json)", s.LogFormat)
	}
}

// validateConfigSource checks CONFIG_TYPE and the xDS client.
func (s Settings) validateConfigSource(bad complaint) {
	switch strings.ToUpper(s.ConfigType) {
	case "FILE", "GRPC_XDS_SOTW":
	default:
		bad("CONFIG_TYPE", "unknown type %q (want FILE or GRPC_XDS_SOTW)", s.ConfigType)
	}
	if _, err := config.ParseWildcardPrecedence(s.WildcardPrecedence); err != nil {
		bad("WILDCARD_PRECEDENCE", "%v", err)
	}
	if (s.XDSClientTLSCert == "") != (s.XDSClientTLSKey == "") {
		bad("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "and CONFIG_GRPC_XDS_CLIENT_TLS_KEY must be set together")
	}
	if s.XDSConnectRetryInterval <= 0 {
		bad("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "must be positive, got %v", s.XDSConnectRetryInterval)
	}
	if s.XDSBackoffInitial <= 0 {
		bad("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "must be positive, got %v", s.XDSBackoffInitial)
	}
	if s.XDSBackoffMax < s.XDSBackoffInitial {
		bad("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "must be at least XDS_CLIENT_BACKOFF_INITIAL_INTERVAL (%v), got %v", s.XDSBackoffInitial, s.XDSBackoffMax)
	}
	if s.XDSBackoffRandomFactor < 0 || s.XDSBackoffRandomFactor > 1 {
		bad("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "must be in [0, 1], got %v", s.XDSBackoffRandomFactor)
	}
	if s.XDSMaxMsgSize < 0 {
		bad("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "must not be negative, got %d", s.XDSMaxMsgSize)
	}
	if _, err := pairs(s.XDSNodeMetadata, ":="); err != nil {
		bad("CONFIG_GRPC_XDS_NODE_METADATA", "%v (want k1:v1,k2:v2)", err)
	}
	if _, err := pairs(s.XDSAdditionalHeaders, ":"); err != nil {
		bad("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "%v (want k1:v1,k2:v2)", err)
	}
}

// validateObservability checks statsd, metrics, tracing and /limited.
func (s Settings) validateObservability(bad complaint) {
	if s.StatsdProtocol != "tcp" && s.StatsdProtocol != "udp" {
		bad("STATSD_PROTOCOL", "unknown protocol %q (want tcp or udp)", s.StatsdProtocol)
	}
	if s.StatsFlushInterval <= 0 {
		bad("STATS_FLUSH_INTERVAL", "must be positive, got %v", s.StatsFlushInterval)
	}
	if s.NearLimitRatio <= 0 || s.NearLimitRatio > 1 {
		bad("NEAR_LIMIT_RATIO", "must be in (0, 1], got %v", s.NearLimitRatio)
	}
	if s.MaxDetailedMetricSeries < 1 {
		bad("MAX_DETAILED_METRIC_SERIES", "must be at least 1, got %d", s.MaxDetailedMetricSeries)
	}
	if s.StatsdPort < 1 || s.StatsdPort > 65535 {
		bad("STATSD_PORT", "port %d out of range 1-65535", s.StatsdPort)
	}
	if _, err := pairs(s.ExtraTags, ":"); err != nil {
		bad("EXTRA_TAGS", "%v (want k1:v1,k2:v2)", err)
	}
	if !strings.HasPrefix(s.PrometheusPath, "/") {
		bad("PROMETHEUS_PATH", "must start with /, got %q", s.PrometheusPath)
	}
	if p := strings.ToLower(s.TracingExporterProtocol); p != "http" && p != "grpc" {
		bad("TRACING_EXPORTER_PROTOCOL", "unknown protocol %q (want http or grpc)", s.TracingExporterProtocol)
	}
	if s.TracingSamplingRate < 0 || s.TracingSamplingRate > 1 {
		bad("TRACING_SAMPLING_RATE", "must be in [0, 1], got %v", s.TracingSamplingRate)
	}
	if s.TopLimitedSize < 0 || s.TopLimitedMetric < 0 || s.TopLimitedMetric > 1000 {
		bad("TOP_LIMITED_SIZE", "and TOP_LIMITED_METRIC must not be negative, TOP_LIMITED_METRIC at most 1000")
	}
	if s.TopLimitedWindow <= 0 {
		bad("TOP_LIMITED_WINDOW", "must be positive, got %v", s.TopLimitedWindow)
	}
}

// validateLease checks the leased budgets' timing.
func (s Settings) validateLease(bad complaint) {
	if s.LeaseInterval < 0 || s.LeaseInterval > 10*time.Second {
		bad("LEASE_INTERVAL", "must be from 0 (off) to 10s, got %v", s.LeaseInterval)
	}
	if s.LeaseIdle < 10*time.Millisecond || s.LeaseIdle > time.Hour {
		bad("LEASE_IDLE", "must be from 10ms to 1h, got %v", s.LeaseIdle)
	}
}

// validateStore checks the backend, Redis, the key prefix, failure policies and the embedded store.
func (s Settings) validateStore(bad complaint) {
	switch s.Backend() {
	case "memory":
	case "redis":
		if s.Redis.URL == "" {
			bad("REDIS_URL", "required with BACKEND_TYPE=redis")
		}
		s.Redis.validate("REDIS_", bad)
		if s.RedisPerSecond {
			if s.RedisPerSecondConfig.URL == "" {
				bad("REDIS_PERSECOND_URL", "required with REDIS_PERSECOND=true")
			}
			s.RedisPerSecondConfig.validate("REDIS_PERSECOND_", bad)
		}
	case "memcache":
		bad("BACKEND_TYPE", "memcache is not supported by this service (want memory or redis)")
	default:
		bad("BACKEND_TYPE", "unknown backend %q (want memory or redis)", s.BackendType)
	}
	if strings.ContainsAny(s.CacheKeyPrefix, "{}") {
		bad("CACHE_KEY_PREFIX", "must not contain { or }: they would break the Redis Cluster hash tag of every key")
	}
	if !config.FailurePolicy(s.BackendFailurePolicy).Valid() {
		bad("BACKEND_FAILURE_POLICY", "unknown policy %q (want error, allow, deny or local)", s.BackendFailurePolicy)
	}
	if s.CircuitBreakerFailures < 0 {
		bad("CIRCUIT_BREAKER_FAILURES", "must not be negative, got %d", s.CircuitBreakerFailures)
	}
	if s.CircuitBreakerProbeInterval <= 0 {
		bad("CIRCUIT_BREAKER_PROBE_INTERVAL", "must be positive, got %v", s.CircuitBreakerProbeInterval)
	}
	if s.MemoryMaxBytes < 1<<20 {
		bad("MEMORY_MAX_BYTES", "must be at least 1048576 (1 MiB), got %d", s.MemoryMaxBytes)
	}
	if s.MemoryMaxKeys < 1 {
		bad("MEMORY_MAX_KEYS", "must be at least 1, got %d", s.MemoryMaxKeys)
	}
	if s.LocalCacheSizeInBytes < 0 {
		bad("LOCAL_CACHE_SIZE_IN_BYTES", "must not be negative")
	}
}

// validateRequestBounds checks the bounds on requests and on what gRPC clients may hold.
func (s Settings) validateRequestBounds(bad complaint) {
	for _, l := range []struct {
		name string
		v    int
	}{{"REQUEST_MAX_DESCRIPTORS", s.RequestMaxDescriptors}, {"REQUEST_MAX_ENTRIES", s.RequestMaxEntries},
		{"REQUEST_MAX_STRING_BYTES", s.RequestMaxStringBytes}, {"REQUEST_MAX_BYTES", s.RequestMaxBytes},
		{"REQUEST_MAX_KEYS", s.RequestMaxKeys}, {"GRPC_MAX_CONNECTIONS", s.GRPCMaxConnections},
		{"GRPC_MAX_CONNECTIONS_PER_ADDRESS", s.GRPCMaxConnectionsPerAddress},
		{"HTTP_MAX_CONNECTIONS", s.HTTPMaxConnections}, {"HTTP_MAX_CONNECTIONS_PER_ADDRESS", s.HTTPMaxConnectionsPerAddress},
		{"GRPC_MAX_CALLS_IN_FLIGHT", s.GRPCMaxCallsInFlight}, {"GRPC_MAX_RESETS_PER_SECOND", s.GRPCMaxResetsPerSecond},
		{"GRPC_MAX_CONCURRENT_STREAMS", s.GRPCMaxConcurrentStreams}} {
		if l.v < 1 {
			bad(l.name, "must be at least 1, got %d", l.v)
		}
	}
	if s.GRPCMaxConcurrentStreams > math.MaxUint32 {
		bad("GRPC_MAX_CONCURRENT_STREAMS", "must be at most %d, got %d", uint32(math.MaxUint32), s.GRPCMaxConcurrentStreams)
	}
	if s.RequestMaxEntries > config.MaxDepth {
		bad("REQUEST_MAX_ENTRIES", "must be at most %d (the deepest a config may nest), got %d", config.MaxDepth, s.RequestMaxEntries)
	}
	if s.RequestMaxHits < 1 {
		bad("REQUEST_MAX_HITS", "must be at least 1")
	}
}

func (r Redis) validate(prefix string, bad complaint) {
	switch r.Type {
	case "single", "sentinel", "cluster":
	default:
		bad(prefix+"TYPE", "unknown type %q (want single, sentinel or cluster)", r.Type)
	}
	switch r.SocketType {
	case "tcp", "unix":
	default:
		bad(prefix+"SOCKET_TYPE", "unknown socket type %q (want tcp or unix)", r.SocketType)
	}
	if r.Type == "sentinel" && len(strings.Split(r.URL, ",")) < 2 {
		bad(prefix+"URL", "sentinel wants master-name,host:port[,host:port...], got %q", r.URL)
	}
	switch r.PoolOnEmptyBehavior {
	case "CREATE", "ERROR", "WAIT":
	default:
		bad(prefix+"POOL_ON_EMPTY_BEHAVIOR", "unknown behavior %q (want CREATE, ERROR or WAIT)", r.PoolOnEmptyBehavior)
	}
	if r.PoolOnEmptyWaitDuration <= 0 {
		bad(prefix+"POOL_ON_EMPTY_WAIT_DURATION", "must be positive, got %v", r.PoolOnEmptyWaitDuration)
	}
	if r.PoolSize < 1 {
		bad(prefix+"POOL_SIZE", "must be at least 1, got %d", r.PoolSize)
	}
	if r.Timeout <= 0 {
		bad(prefix+"TIMEOUT", "must be positive, got %v", r.Timeout)
	}
	if r.PipelineWindow < 0 {
		bad(prefix+"PIPELINE_WINDOW", "must not be negative, got %v (0 turns batching off)", r.PipelineWindow)
	}
	if r.PipelineLimit < 0 {
		bad(prefix+"PIPELINE_LIMIT", "must not be negative, got %d (0 means 128)", r.PipelineLimit)
	}
	if r.PipelineMaxInFlight < 1 {
		bad(prefix+"PIPELINE_MAX_IN_FLIGHT", "must be at least 1, got %d", r.PipelineMaxInFlight)
	}
	if (r.TLSClientCert == "") != (r.TLSClientKey == "") {
		bad(prefix+"TLS_CLIENT_CERT", "and %sTLS_CLIENT_KEY must be set together", prefix)
	}
}

// pairs parses "k1:v1,k2:v2" (EXTRA_TAGS, xDS headers and metadata; seps
// are the separators a pair may use between key and value).
func pairs(s, seps string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		i := strings.IndexAny(kv, seps)
		if i <= 0 {
			return nil, fmt.Errorf("%q is not key:value", kv)
		}
		out[strings.TrimSpace(kv[:i])] = strings.TrimSpace(kv[i+1:])
	}
	return out, nil
}

// Tags returns EXTRA_TAGS as a map (validated by Load).
func (s Settings) Tags() map[string]string {
	t, _ := pairs(s.ExtraTags, ":")
	return t
}

// XDSMetadata returns CONFIG_GRPC_XDS_NODE_METADATA as a map (validated by
// Load); the reference takes "k:v" and "k=v" alike.
func (s Settings) XDSMetadata() map[string]string {
	m, _ := pairs(s.XDSNodeMetadata, ":=")
	return m
}

// XDSHeaders returns CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS as a map
// (validated by Load).
func (s Settings) XDSHeaders() map[string]string {
	m, _ := pairs(s.XDSAdditionalHeaders, ":")
	return m
}

// Names lists every environment variable the service reads; the examples'
// tests check the deployment manifests' variables against it.
func Names() []string {
	var out []string
	add := func(t reflect.Type, prefix string) {
		for i := 0; i < t.NumField(); i++ {
			if name := t.Field(i).Tag.Get("envconfig"); name != "" {
				out = append(out, prefix+name)
			}
		}
	}
	add(reflect.TypeOf(Settings{}), "")
	add(reflect.TypeOf(Redis{}), "REDIS_")
	add(reflect.TypeOf(Redis{}), "REDIS_PERSECOND_")
	sort.Strings(out)
	return out
}
