package settings

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/openrls/ratelimit/src/elasticache"
	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/memcache"
	"github.com/openrls/ratelimit/src/redis"
	"github.com/openrls/ratelimit/src/tlsclient"
)

// Store is where counters live: the backend, the embedded store's
// budget, Redis, and the breaker and caches in front of it.
type Store struct {
	// Backend: "memory", "redis" or "memcache"; empty means redis when
	// REDIS_URL is set, else memory.
	BackendType string `envconfig:"BACKEND_TYPE"`
	// MemoryMaxKeys bounds the embedded store (our own setting).
	MemoryMaxKeys int `envconfig:"MEMORY_MAX_KEYS" default:"1048576"`
	// MemoryMaxBytes bounds the bytes its counters hold (sliding logs
	// count by their entries); 256 MiB.
	MemoryMaxBytes int64 `envconfig:"MEMORY_MAX_BYTES" default:"268435456"`

	// CircuitBreakerFailures in a row open the Redis circuit breaker (0: no
	// breaker); CircuitBreakerProbeInterval paces its probes while open.
	CircuitBreakerFailures      int           `envconfig:"CIRCUIT_BREAKER_FAILURES" default:"5"`
	CircuitBreakerProbeInterval time.Duration `envconfig:"CIRCUIT_BREAKER_PROBE_INTERVAL" default:"500ms"`

	Redis          Redis `ignored:"true"`
	RedisPerSecond bool  `envconfig:"REDIS_PERSECOND" default:"false"`
	// RedisPerSecondConfig is the REDIS_PERSECOND_* twin, used when
	// RedisPerSecond is set.
	RedisPerSecondConfig Redis `ignored:"true"`
	Memcache
	// CacheKeyPrefix starts every counter key (Redis and memcache).
	CacheKeyPrefix string `envconfig:"CACHE_KEY_PREFIX"`
	// CacheKeyHashValues writes descriptor values hashed in counter keys.
	CacheKeyHashValues bool `envconfig:"CACHE_KEY_HASH_VALUES" default:"false"`
	// LocalCacheSizeInBytes sizes the local over-limit cache (0: off).
	LocalCacheSizeInBytes int `envconfig:"LOCAL_CACHE_SIZE_IN_BYTES" default:"0"`
	// Leased budgets for limits with lease: true (ours): how long a slice
	// should last at a replica's recent rate (0: every hit is decided in
	// Redis), and how long an unused slice is kept before it goes back.
	LeaseInterval time.Duration `envconfig:"LEASE_INTERVAL" default:"50ms"`
	LeaseIdle     time.Duration `envconfig:"LEASE_IDLE" default:"1s"`
	// ExpirationJitterMaxSeconds lengthens every Redis and memcache key's
	// expiry by a random amount below it, as the reference's does. The
	// default is 0 here (the reference's is 300): a key expires when its
	// window ends, so a per-second window's keys are not kept for minutes.
	ExpirationJitterMaxSeconds int64 `envconfig:"EXPIRATION_JITTER_MAX_SECONDS" default:"0"`
}

// maxJitterSeconds bounds EXPIRATION_JITTER_MAX_SECONDS: a day of extra life
// for every key is already far past any use in spreading expiries.
const maxJitterSeconds = 86400

// expirationJitter is EXPIRATION_JITTER_MAX_SECONDS as a duration.
func (s Store) expirationJitter() time.Duration {
	return time.Duration(s.ExpirationJitterMaxSeconds) * time.Second
}

// Redis is one Redis connection's settings; the REDIS_ and
// REDIS_PERSECOND_ groups share this shape.
type Redis struct {
	URL string `envconfig:"URL"`
	// Type and SocketType are read case-insensitively, as the reference
	// reads them ("SINGLE" is its default's spelling). SocketType unset:
	// unix for a URL that is a path, else tcp.
	Type       string `envconfig:"TYPE" default:"single"`
	SocketType string `envconfig:"SOCKET_TYPE"`
	Auth       string `envconfig:"AUTH"`
	// AuthFile holds "password" or "user:password", read again for every
	// new connection (the name of envoyproxy/ratelimit PR #1224).
	AuthFile string `envconfig:"AUTH_FILE"`
	// AWSIAMAuth authenticates to AWS ElastiCache (or MemoryDB) with IAM:
	// a token signed for every new connection from the AWS SDK's default
	// credential chain, as user AWSIAMUserID of cache AWSIAMCacheName
	// (REDIS_AWS_IAM_AUTH, the name of envoyproxy/ratelimit PR #1224).
	AWSIAMAuth            bool   `envconfig:"AWS_IAM_AUTH" default:"false"`
	AWSIAMUserID          string `envconfig:"AWS_IAM_USER_ID"`
	AWSIAMCacheName       string `envconfig:"AWS_IAM_CACHE_NAME"`
	AWSIAMRegion          string `envconfig:"AWS_IAM_REGION"`
	AWSIAMServerless      bool   `envconfig:"AWS_IAM_SERVERLESS" default:"false"`
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
	PipelineMaxInFlight         int           `envconfig:"PIPELINE_MAX_IN_FLIGHT" default:"1"`
	HealthCheckActiveConnection bool          `envconfig:"HEALTH_CHECK_ACTIVE_CONNECTION" default:"false"`
}

// Memcache is the memcache store's settings (BACKEND_TYPE=memcache), as
// the reference names them.
type Memcache struct {
	// MemcacheHostPort lists the servers, host:port,...; MemcacheSRV looks
	// them up instead (_service._proto.name), again every
	// MemcacheSRVRefresh when that is set.
	MemcacheHostPort              []string      `envconfig:"MEMCACHE_HOST_PORT"`
	MemcacheSRV                   string        `envconfig:"MEMCACHE_SRV"`
	MemcacheSRVRefresh            time.Duration `envconfig:"MEMCACHE_SRV_REFRESH" default:"0"`
	MemcacheMaxIdleConns          int           `envconfig:"MEMCACHE_MAX_IDLE_CONNS" default:"2"`
	MemcacheTLS                   bool          `envconfig:"MEMCACHE_TLS" default:"false"`
	MemcacheTLSClientCert         string        `envconfig:"MEMCACHE_TLS_CLIENT_CERT"`
	MemcacheTLSClientKey          string        `envconfig:"MEMCACHE_TLS_CLIENT_KEY"`
	MemcacheTLSCACert             string        `envconfig:"MEMCACHE_TLS_CACERT"`
	MemcacheTLSSkipHostnameVerify bool          `envconfig:"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION" default:"false"`
	// MemcacheTimeout bounds each memcache operation (ours; the
	// reference's client waits 500ms).
	MemcacheTimeout time.Duration `envconfig:"MEMCACHE_TIMEOUT" default:"500ms"`
}

func (m Memcache) validate(bad complaint) {
	switch {
	case len(m.MemcacheHostPort) > 0 && m.MemcacheSRV != "":
		bad("MEMCACHE_HOST_PORT", "and MEMCACHE_SRV are both set: the servers come from one of them")
	case len(m.MemcacheHostPort) == 0 && m.MemcacheSRV == "":
		bad("MEMCACHE_HOST_PORT", "or MEMCACHE_SRV is required with BACKEND_TYPE=memcache")
	}
	for _, a := range m.MemcacheHostPort {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			bad("MEMCACHE_HOST_PORT", "%q: want host:port", a)
		}
	}
	if m.MemcacheSRV != "" {
		if err := memcache.CheckSRV(m.MemcacheSRV); err != nil {
			bad("MEMCACHE_SRV", "%v", err)
		}
	}
	if m.MemcacheSRVRefresh < 0 {
		bad("MEMCACHE_SRV_REFRESH", "must not be negative, got %v (0: look up once)", m.MemcacheSRVRefresh)
	}
	if m.MemcacheMaxIdleConns < 0 {
		bad("MEMCACHE_MAX_IDLE_CONNS", "must not be negative, got %d", m.MemcacheMaxIdleConns)
	}
	if m.MemcacheTimeout <= 0 {
		bad("MEMCACHE_TIMEOUT", "must be positive, got %v", m.MemcacheTimeout)
	}
	if (m.MemcacheTLSClientCert == "") != (m.MemcacheTLSClientKey == "") {
		bad("MEMCACHE_TLS_CLIENT_CERT", "and MEMCACHE_TLS_CLIENT_KEY must be set together")
	}
}

// MemcacheOptions is the memcache store the settings describe, its TLS
// files loaded; the servers are MEMCACHE_HOST_PORT's (cmd/server looks
// MEMCACHE_SRV up). An error names the setting.
func (s Store) MemcacheOptions() (memcache.Options, error) {
	m := s.Memcache
	o := memcache.Options{Servers: m.MemcacheHostPort, Prefix: s.CacheKeyPrefix, Timeout: m.MemcacheTimeout, MaxIdleConns: m.MemcacheMaxIdleConns,
		ExpirationJitter: s.expirationJitter()}
	if m.MemcacheTLS {
		cfg, err := tlsclient.Config(m.MemcacheTLSCACert, m.MemcacheTLSClientCert, m.MemcacheTLSClientKey)
		if err != nil {
			return o, fmt.Errorf("MEMCACHE_TLS: %w", err)
		}
		if m.MemcacheTLSSkipHostnameVerify {
			tlsclient.SkipHostname(cfg)
		}
		o.TLS = cfg
	}
	return o, nil
}

// referenceRedisURL and referenceRedisPerSecondURL are the reference's
// defaults (a twemproxy socket), used when BACKEND_TYPE=redis is set
// without a URL, as the reference uses them.
const (
	referenceRedisURL          = "/var/run/nutcracker/ratelimit.sock"
	referenceRedisPerSecondURL = "/var/run/nutcracker/ratelimitpersecond.sock"
)

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

// isSocketPath tells a Unix socket path from host:port or a redis://
// URL: a path has a slash. (A host:port whose port is no number, say
// localhost:notaport, is a mistake in the port, named as such by
// validate, not a socket.)
func isSocketPath(url string) bool {
	if a, err := redis.ParseAddress(url); err != nil || a.URL {
		return false
	}
	return strings.Contains(url, "/")
}

// badTCPAddress names the first address of a TCP REDIS_URL (a list for
// Cluster, and for Sentinel after the master's name) that is not
// host:port with a port from 1 to 65535, or returns "".
func badTCPAddress(url, typ string) string {
	if strings.Contains(url, "://") {
		return "" // a URL: ClientOptions.Check reads it, its password hidden
	}
	addrs := strings.Split(url, ",")
	if typ == "sentinel" && len(addrs) > 1 {
		addrs = addrs[1:]
	}
	for _, addr := range addrs {
		addr = strings.TrimSpace(addr)
		_, port, err := net.SplitHostPort(addr)
		if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 1 || n > 65535 {
			return addr
		}
	}
	return ""
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
		s.Memcache.validate(bad)
	default:
		bad("BACKEND_TYPE", "unknown backend %q (want memory, redis or memcache)", s.BackendType)
	}
	if strings.ContainsAny(s.CacheKeyPrefix, "{}") {
		bad("CACHE_KEY_PREFIX", "must not contain { or }: they would break the Redis Cluster hash tag of every key")
	}
	if !s.FailurePolicy().Valid() {
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
	if s.ExpirationJitterMaxSeconds < 0 || s.ExpirationJitterMaxSeconds > maxJitterSeconds {
		bad("EXPIRATION_JITTER_MAX_SECONDS", "must be from 0 (off) to %d (a day), got %d", maxJitterSeconds, s.ExpirationJitterMaxSeconds)
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
	// One fact, said once: the client's own check of the address says it
	// most precisely (too many colons, a port that is not a number, a
	// sentinel URL's form), with a hint for a Unix socket; the generic
	// check only where that one passes.
	validType := r.Type == "single" || r.Type == "sentinel" || r.Type == "cluster"
	checked := false
	if r.URL != "" && validType && (r.SocketType == "tcp" || r.SocketType == "unix") {
		if err := (redis.ClientOptions{URL: r.URL, Type: r.Type, Network: r.SocketType}).Check(); err != nil {
			hint := ""
			if r.SocketType == "tcp" && !strings.Contains(r.URL, "://") {
				hint = fmt.Sprintf(" (a Unix socket is a path: /run/redis.sock, or set %sSOCKET_TYPE=unix)", prefix)
			}
			bad(prefix+"URL", "%v%s", err, hint)
			checked = true
		}
	}
	if r.SocketType == "tcp" && r.URL != "" && !checked {
		if a := badTCPAddress(r.URL, r.Type); a != "" {
			bad(prefix+"URL", "%q is not host:port with a port from 1 to 65535 (a Unix socket is a path: /run/redis.sock, or set %sSOCKET_TYPE=unix)", a, prefix)
		}
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
	r.validateAuth(prefix, bad)
}

// validateAuth checks where the credentials come from: REDIS_AUTH,
// REDIS_AUTH_FILE or ElastiCache IAM, one at most, and that what they
// need can be read now rather than failing every connection later.
func (r Redis) validateAuth(prefix string, bad complaint) {
	if r.AWSIAMAuth {
		if r.Auth != "" || r.AuthFile != "" {
			bad(prefix+"AWS_IAM_AUTH", "and %sAUTH or %sAUTH_FILE are both set: the credentials come from one of them", prefix, prefix)
		}
		if r.AWSIAMUserID == "" || r.AWSIAMCacheName == "" {
			bad(prefix+"AWS_IAM_AUTH", "needs %sAWS_IAM_USER_ID (the ElastiCache user) and %sAWS_IAM_CACHE_NAME (the cache's name, not its endpoint)", prefix, prefix)
		} else if _, err := r.iamSigner(); err != nil {
			bad(prefix+"AWS_IAM_AUTH", "%v", err)
		}
	}
	if r.AuthFile != "" {
		if r.Auth != "" {
			bad(prefix+"AUTH_FILE", "and %sAUTH are both set: the credentials come from one of them", prefix)
		}
		// Read once now, so that a missing, unreadable or empty file stops
		// start-up instead of every connection failing later.
		if _, _, err := redis.ReadCredentials(r.AuthFile); err != nil {
			bad(prefix+"AUTH_FILE", "%v", err)
		}
	}
}

// MemoryOptions is the embedded store's budget.
func (s Store) MemoryOptions() limiter.MemoryOptions {
	return limiter.MemoryOptions{MaxKeys: s.MemoryMaxKeys, MaxBytes: s.MemoryMaxBytes}
}

// ClientOptions is the Redis client r describes, its TLS files loaded;
// an error names the TLS setting (the caller prefixes the group's name).
func (r Redis) ClientOptions() (redis.ClientOptions, error) {
	opts := redis.ClientOptions{URL: r.URL, Type: r.Type, Network: r.SocketType, Auth: r.Auth,
		SentinelAuth: r.SentinelAuth, PoolSize: r.PoolSize, Timeout: r.Timeout}
	switch {
	case r.AuthFile != "":
		opts.Credentials = redis.FileCredentials(r.AuthFile)
	case r.AWSIAMAuth:
		signer, err := r.iamSigner()
		if err != nil {
			return opts, fmt.Errorf("AWS_IAM_AUTH: %w", err)
		}
		opts.Credentials, opts.MaxConnAge = signer.Auth, elasticache.MaxConnAge
	}
	if r.PoolOnEmptyBehavior != "CREATE" { // WAIT and ERROR: wait this long for a connection, then fail
		opts.PoolTimeout = r.PoolOnEmptyWaitDuration
	}
	if r.TLS || redis.WantsTLS(r.URL) {
		tlsCfg, err := redis.TLSConfig(r.TLSCACert, r.TLSClientCert, r.TLSClientKey, r.TLSSkipHostnameVerify)
		if err != nil {
			return opts, fmt.Errorf("TLS: %w", err)
		}
		opts.TLS = tlsCfg
	}
	return opts, nil
}

// iamSigner is the ElastiCache IAM signer r describes (local AWS
// configuration read; credentials are fetched at the first connection).
func (r Redis) iamSigner() (*elasticache.Signer, error) {
	return elasticache.New(context.Background(), elasticache.Options{CacheName: r.AWSIAMCacheName, UserID: r.AWSIAMUserID,
		Region: r.AWSIAMRegion, Serverless: r.AWSIAMServerless})
}

// RedisOptions is the Redis store over the connection r describes.
func (s Store) RedisOptions(r Redis) redis.Options {
	return redis.Options{Prefix: s.CacheKeyPrefix, LocalCacheBytes: s.LocalCacheSizeInBytes, Timeout: r.Timeout,
		Batch: r.PipelineWindow > 0, BatchLimit: r.PipelineLimit, BatchInFlight: r.PipelineMaxInFlight,
		LeaseInterval: s.LeaseInterval, LeaseIdle: s.LeaseIdle, ExpirationJitter: s.expirationJitter()}
}

// BreakerOptions is the circuit breaker's thresholds; cmd/server adds the
// probe and what a change of state does.
func (s Store) BreakerOptions() limiter.BreakerOptions {
	return limiter.BreakerOptions{Failures: s.CircuitBreakerFailures, ProbeInterval: s.CircuitBreakerProbeInterval}
}
