// Package stores opens the store the settings name: the embedded memory
// store, Redis (with its per-second Redis when one is set) or memcache,
// each behind the circuit breaker when one is set, with its metrics, its
// health check and its log lines. It is where the process's wiring meets
// the stores, so that main only calls Open.
package stores

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"github.com/sirupsen/logrus"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/memcache"
	"github.com/openrls/ratelimit/src/metrics"
	"github.com/openrls/ratelimit/src/redis"
	"github.com/openrls/ratelimit/src/server"
	"github.com/openrls/ratelimit/src/settings"
)

// Deps is what opening a store needs of the process.
type Deps struct {
	Settings settings.Settings
	Log      logrus.FieldLogger
	Health   *server.Health // Redis's checks join it (REDIS_HEALTH_CHECK_ACTIVE_CONNECTION)
	Metrics  *metrics.Registry
}

// OpenFallback opens the embedded store answering hits whose failure
// policy is local while the main store fails (MEMORY_* sizes it), its
// metrics labelled store="fallback".
func OpenFallback(d Deps) *limiter.MemoryStore {
	m := limiter.NewMemoryStore(d.Settings.MemoryOptions())
	countFull(d.Metrics, "fallback", m)
	return m
}

// Open opens the store the settings name (BACKEND_TYPE) and returns it
// with a function that releases it. A Redis or memcache store sits behind
// a circuit breaker unless CIRCUIT_BREAKER_FAILURES=0.
func Open(ctx context.Context, d Deps) (limiter.Store, func(), error) {
	s, log, health, reg := d.Settings, d.Log, d.Health, d.Metrics
	switch s.Backend() {
	case "memory":
		mem := limiter.NewMemoryStore(s.MemoryOptions())
		countFull(reg, "main", mem)
		log.WithField("max_keys", s.MemoryMaxKeys).Info("using the embedded in-memory store")
		return mem, mem.Close, nil
	case "memcache":
		return newMemcache(ctx, s, log, reg)
	}
	redis.RouteLogs(log.WithField("component", "go-redis"))
	main, mainRedis, closeMain, err := newRedis(ctx, "REDIS_", s.Redis, s, log, health, reg)
	if err != nil {
		return nil, nil, err
	}
	if !s.RedisPerSecond {
		exportLocalCache(reg, s, mainRedis)
		return main, closeMain, nil
	}
	perSecond, psRedis, closePS, err := newRedis(ctx, "REDIS_PERSECOND_", s.RedisPerSecondConfig, s, log, health, reg)
	if err != nil {
		closeMain()
		return nil, nil, err
	}
	exportLocalCache(reg, s, mainRedis, psRedis)
	return limiter.Split{PerSecond: perSecond, Other: main}, func() { closePS(); closeMain() }, nil
}

// exportLocalCache sends the local over-limit cache's counts to statsd as
// the reference's gauges (ratelimit.localcache.*), summed over the Redis
// stores: the reference has one cache for both.
func exportLocalCache(reg *metrics.Registry, s settings.Settings, stores ...*redis.Store) {
	if s.LocalCacheSizeInBytes <= 0 {
		return
	}
	sum := func(f func(*redis.Store) uint64) func() uint64 {
		return func() uint64 {
			var n uint64
			for _, st := range stores {
				n += f(st)
			}
			return n
		}
	}
	hits, misses := sum((*redis.Store).CacheHits), sum((*redis.Store).CacheMisses)
	reg.GaugeStatFunc("ratelimit.localcache.hitCount", hits)
	reg.GaugeStatFunc("ratelimit.localcache.missCount", misses)
	reg.GaugeStatFunc("ratelimit.localcache.lookupCount", func() uint64 { return hits() + misses() })
	stat := func(f func(redis.CacheStats) uint64) func() uint64 {
		return sum(func(st *redis.Store) uint64 { return f(st.CacheStats()) })
	}
	reg.GaugeStatFunc("ratelimit.localcache.entryCount", stat(func(c redis.CacheStats) uint64 { return c.Entries }))
	reg.GaugeStatFunc("ratelimit.localcache.expiredCount", stat(func(c redis.CacheStats) uint64 { return c.Expired }))
	reg.GaugeStatFunc("ratelimit.localcache.overwriteCount", stat(func(c redis.CacheStats) uint64 { return c.Overwritten }))
	// This cache declines a new entry when full rather than evict a live
	// one: nothing is evacuated, and the gauge says so.
	reg.GaugeStatFunc("ratelimit.localcache.evacuateCount", func() uint64 { return 0 })
	// The mean of the stores' averages, weighted by their entries.
	reg.GaugeStatFunc("ratelimit.localcache.averageAccessTime", func() uint64 {
		var sum, n float64
		for _, st := range stores {
			c := st.CacheStats()
			sum, n = sum+float64(c.AverageAccess)*float64(c.Entries), n+float64(c.Entries)
		}
		if n == 0 {
			return 0
		}
		return uint64(sum / n)
	})
}

// newRedis connects the Redis store named by name ("REDIS_" or
// "REDIS_PERSECOND_", as its settings are named) and exports its metrics
// and health check; the Store it returns is behind the circuit breaker
// when one is set.
func newRedis(ctx context.Context, name string, r settings.Redis, s settings.Settings, log logrus.FieldLogger, health *server.Health,
	reg *metrics.Registry) (limiter.Store, *redis.Store, func(), error) {
	client, err := redisClient(name, r)
	if err != nil {
		return nil, nil, nil, err
	}
	conns := redis.CountConns(client)
	pool := "ratelimit.redis_pool"
	if name == "REDIS_PERSECOND_" {
		pool = "ratelimit.redis_per_second_pool"
	}
	reg.GaugeStatFunc(pool+".cx_active", conns.Active)
	reg.StatFunc(pool+".cx_total", conns.Total)
	store, err := redis.New(client, s.RedisOptions(r))
	if err != nil {
		client.Close()
		return nil, nil, nil, err
	}
	// Slices go back before the connections close.
	release := func() { store.Close(); _ = client.Close() }
	exportLeases(reg, storeLabel(name), store)
	pctx, cancel := context.WithTimeout(ctx, r.Timeout)
	defer cancel()
	if err := store.Preload(pctx); err != nil {
		log.WithError(err).WithField("url", redis.MaskURL(r.URL)).Warnf(
			"redis is not reachable yet; serving anyway and retrying per request (decisions get the failure policy until it is; the health check stays healthy unless %sHEALTH_CHECK_ACTIVE_CONNECTION=true). If the address is wrong, set %sURL (host:port, a redis:// URL, or a socket path with %sSOCKET_TYPE=unix)",
			name, name, name)
	}
	if err := store.FunctionsRefused(); err != nil {
		log.WithError(err).Info("redis refuses Lua functions (Redis before 7, or an ACL without FUNCTION): decisions run as a script, which costs Redis more per call")
	}
	if r.HealthCheckActiveConnection {
		health.AddCheck("redis "+redis.MaskURL(r.URL), func() error {
			c, cancel := context.WithTimeout(context.Background(), min(r.Timeout, time.Second))
			defer cancel()
			return store.Ping(c)
		})
	}
	if s.LocalCacheSizeInBytes > 0 {
		reg.CounterFunc("ratelimit_local_cache_hits_total", "Hits answered OVER_LIMIT by the local cache without Redis.",
			prometheus.Labels{"redis": storeLabel(name)}, func() float64 { return float64(store.CacheHits()) })
	}
	log.WithFields(logrus.Fields{"type": r.Type, "url": redis.MaskURL(r.URL)}).Info("using redis")
	if s.CircuitBreakerFailures == 0 {
		return store, store, release, nil
	}
	br := withBreaker("redis", name, s, log.WithField("redis", redis.MaskURL(r.URL)), reg, store, store.Ping)
	return br, store, func() { br.Close(); release() }, nil
}

// redisClient builds the client r describes; errors name the setting.
func redisClient(name string, r settings.Redis) (goredis.UniversalClient, error) {
	opts, err := r.ClientOptions()
	if err != nil {
		return nil, fmt.Errorf("%s%w", name, err) // "TLS: ..." from ClientOptions
	}
	client, err := redis.NewClient(opts)
	if err != nil {
		return nil, fmt.Errorf("%sURL: %w", name, err)
	}
	return client, nil
}

// withBreaker puts store (kind: redis or memcache) behind the circuit
// breaker the settings describe, its state exported (labelled by name, the
// settings' prefix) and its changes logged to blog.
func withBreaker(kind, name string, s settings.Settings, blog logrus.FieldLogger, reg *metrics.Registry, store limiter.Store,
	probe func(context.Context) error) *limiter.Breaker {
	var isOpen atomic.Bool
	reg.GaugeFunc("ratelimit_circuit_breaker_open", "1 while the store's circuit breaker is open (answering by failure policy without calling it).",
		prometheus.Labels{"redis": storeLabel(name)}, func() float64 {
			if isOpen.Load() {
				return 1
			}
			return 0
		})
	opts := s.BreakerOptions()
	opts.Probe = probe
	opts.OnChange = func(open bool) {
		isOpen.Store(open)
		if open {
			blog.Errorf("%s circuit breaker open: answering by failure policy without waiting for %s", kind, kind)
		} else {
			blog.Warnf("%s circuit breaker closed: %s answers again", kind, kind)
		}
	}
	return limiter.NewBreaker(store, opts)
}

// newMemcache connects the memcache store: its servers from
// MEMCACHE_HOST_PORT, or looked up from MEMCACHE_SRV (again every
// MEMCACHE_SRV_REFRESH), behind the circuit breaker when one is set.
func newMemcache(ctx context.Context, s settings.Settings, log logrus.FieldLogger, reg *metrics.Registry) (limiter.Store, func(), error) {
	opts, err := s.MemcacheOptions()
	if err != nil {
		return nil, nil, err
	}
	if s.MemcacheSRV != "" {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		opts.Servers, err = memcache.SRVServers(lctx, net.DefaultResolver.LookupSRV, s.MemcacheSRV)
		cancel()
		if err != nil {
			return nil, nil, fmt.Errorf("MEMCACHE_SRV: %w", err)
		}
	}
	store, err := memcache.New(opts)
	if err != nil {
		return nil, nil, err
	}
	mlog := log.WithField("memcache", strings.Join(opts.Servers, ","))
	watchCtx, stopWatch := context.WithCancel(ctx)
	if s.MemcacheSRV != "" && s.MemcacheSRVRefresh > 0 {
		go store.WatchSRV(watchCtx, net.DefaultResolver.LookupSRV, s.MemcacheSRV, s.MemcacheSRVRefresh, func(err error) {
			log.WithError(err).Warn("memcache: SRV refresh failed; keeping the servers there are")
		})
	}
	if err := store.Ping(ctx); err != nil {
		mlog.WithError(err).Warn("memcache is not reachable yet; serving anyway and retrying per request")
	}
	mlog.Info("using memcache")
	release := func() { stopWatch(); store.Close() }
	if s.CircuitBreakerFailures == 0 {
		return store, release, nil
	}
	br := withBreaker("memcache", "MEMCACHE", s, mlog, reg, store, store.Ping)
	return br, func() { br.Close(); release() }, nil
}

// exportLeases exports a Redis store's leased budgets per rule.
func exportLeases(reg *metrics.Registry, name string, store *redis.Store) {
	reg.Leases(name, func() map[string]metrics.LeaseStat {
		out := map[string]metrics.LeaseStat{}
		for rule, st := range store.LeaseStats() {
			out[rule] = metrics.LeaseStat(st)
		}
		return out
	})
}

// storeLabel is the redis label of a store's series, from its settings'
// prefix: main (REDIS_), per_second (REDIS_PERSECOND_) or memcache
// (MEMCACHE_), rather than the prefix itself (redis="REDIS" read oddly).
func storeLabel(prefix string) string {
	switch prefix {
	case "REDIS_":
		return "main"
	case "REDIS_PERSECOND_":
		return "per_second"
	}
	return strings.ToLower(strings.TrimSuffix(prefix, "_"))
}

// countFull exports how many live counters a memory store dropped
// because it was full (MEMORY_MAX_KEYS, MEMORY_MAX_BYTES), and the bytes
// it holds.
func countFull(reg *metrics.Registry, store string, m *limiter.MemoryStore) {
	reg.CounterFunc("ratelimit_memory_full_total",
		"Calls the embedded store refused for want of room for a new counter, every counter it holds being live "+
			"(MEMORY_MAX_KEYS, MEMORY_MAX_BYTES); they were answered by failure policy.",
		prometheus.Labels{"store": store}, func() float64 { return float64(m.Refused()) })
	reg.GaugeFunc("ratelimit_memory_bytes", "Bytes the embedded store's counters are counted as against MEMORY_MAX_BYTES.",
		prometheus.Labels{"store": store}, func() float64 { return float64(m.Bytes()) })
}
