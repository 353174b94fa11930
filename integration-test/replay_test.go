package integration

// The reference's own integration tests (envoyproxy/ratelimit,
// test/integration), replayed against this binary on Redis: the same config
// files, settings, request sequences, expected answers and expected stats,
// written afresh from what those tests assert. Where the reference's test
// sleeps, this one waits for the condition.

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/memcache/memcachedtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// The reference's test config directory (runtime/current/ratelimit/config).
const (
	replayBasic = `domain: basic
descriptors:
  - key: key1
    rate_limit:
      unit: second
      requests_per_unit: 50

  - key: key1_local
    rate_limit:
      unit: second
      requests_per_unit: 50

  - key: one_per_minute
    rate_limit:
      unit: minute
      requests_per_unit: 1
`
	replayAnother = `domain: another
descriptors:
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20

  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 10

  - key: key2_local
    rate_limit:
      unit: minute
      requests_per_unit: 20

  - key: key3_local
    rate_limit:
      unit: hour
      requests_per_unit: 10

  - key: key4
    rate_limit:
      unit: day
      requests_per_unit: 20

  - key: key4_local
    rate_limit:
      unit: day
      requests_per_unit: 20
`
	replayShareThreshold = `domain: share-threshold-test
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10

  - key: files_no_share
    value: files_no_share/*
    rate_limit:
      unit: hour
      requests_per_unit: 10
`
	replayReload = `domain: reload
descriptors:
  - key: key1
    rate_limit:
      unit: second
      requests_per_unit: 50

  - key: block
    rate_limit:
      unit: second
      requests_per_unit: 0

  - key: one_per_minute
    rate_limit:
      unit: minute
      requests_per_unit: 1
`
)

// replayRedis is the reference test's pair of Redis servers: the main one
// and the per-second one, flushed (and their command counts reset) before
// each case.
type replayRedis struct{ main, perSecond *redistest.Server }

func startReplayRedis(t *testing.T) replayRedis {
	return replayRedis{redistest.Start(t), redistest.Start(t)}
}

func (r replayRedis) flush(t *testing.T) {
	t.Helper()
	for _, s := range []*redistest.Server{r.main, r.perSecond} {
		if _, err := s.Do("FLUSHALL"); err != nil {
			t.Fatalf("FLUSHALL on %s: %v", s.Addr, err)
		}
		if _, err := s.Do("CONFIG", "RESETSTAT"); err != nil {
			t.Fatalf("CONFIG RESETSTAT on %s: %v", s.Addr, err)
		}
	}
}

// env is the reference test's defaultSettings and makeSimpleRedisSettings:
// the config directory, statsd off, Redis over TCP.
func (r replayRedis) env(t *testing.T, perSecond bool, localCache int, extra map[string]string) map[string]string {
	env := writeConfig(t, map[string]string{"basic.yaml": replayBasic, "another.yaml": replayAnother,
		"share_threshold.yaml": replayShareThreshold})
	for k, v := range map[string]string{"USE_STATSD": "false", "BACKEND_TYPE": "redis", "REDIS_SOCKET_TYPE": "tcp",
		"REDIS_PERSECOND_SOCKET_TYPE": "tcp", "REDIS_URL": r.main.Addr, "REDIS_PERSECOND_URL": r.perSecond.Addr,
		"REDIS_PERSECOND": strconv.FormatBool(perSecond), "LOCAL_CACHE_SIZE_IN_BYTES": strconv.Itoa(localCache)} {
		env[k] = v
	}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// debugStats reads the debug port's /stats: every stat as statsd names it.
// A stat not listed reads as 0, as a gauge the reference never set does.
func debugStats(t *testing.T, p *proc) map[string]uint64 {
	t.Helper()
	resp, err := http.Get("http://" + p.debugAddr + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]uint64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), ": ")
		if !ok || name == "cmdline" || name == "memstats" { // Go's expvar, as the reference prints it
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("/stats line %q: %v", sc.Text(), err)
		}
		out[name] = n
	}
	return out
}

// replayStatus is the reference test's newDescriptorStatus: the duration
// until reset is the answer's own, checked apart (reset).
func replayStatus(code rlsv3.RateLimitResponse_Code, rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, remaining uint32,
	got *rlsv3.RateLimitResponse_DescriptorStatus) *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{Code: code, LimitRemaining: remaining,
		CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: rpu, Unit: unit},
		DurationUntilReset: got.GetDurationUntilReset()}
}

var unitLength = map[rlsv3.RateLimitResponse_RateLimit_Unit]time.Duration{
	rlsv3.RateLimitResponse_RateLimit_SECOND: time.Second, rlsv3.RateLimitResponse_RateLimit_MINUTE: time.Minute,
	rlsv3.RateLimitResponse_RateLimit_HOUR: time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY: 24 * time.Hour,
}

// replayRun collects one run's mismatches, and notices when a window ended
// during the run (its counts start over, which the reference's expected
// answers do not allow for): the run is then repeated, not failed.
type replayRun struct {
	t      *testing.T
	p      *proc
	errs   []string
	resets map[string]time.Duration // descriptor → its last duration until reset
	rolled bool
}

func (r *replayRun) errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// ask sends one request of the reference test's shape (one entry per
// descriptor) and checks the answer against want, whose statuses carry
// the answer's own durations until reset; each of those must lie within
// its limit's unit.
func (r *replayRun) ask(what, domain string, entries [][2]string, want func(*rlsv3.RateLimitResponse) *rlsv3.RateLimitResponse) *rlsv3.RateLimitResponse {
	var ds []string
	for _, e := range entries {
		ds = append(ds, e[0]+"="+e[1])
	}
	var descriptors = descs()
	for _, d := range ds {
		descriptors = append(descriptors, configtest.Desc(d))
	}
	resp := r.p.should(r.t, domain, descriptors...)
	for i, st := range resp.GetStatuses() {
		d := st.GetDurationUntilReset()
		if d == nil {
			continue
		}
		if u := unitLength[st.GetCurrentLimit().GetUnit()]; d.AsDuration() <= 0 || d.AsDuration() > u {
			r.errorf("%s: descriptors[%d] resets in %v, want within its unit %v", what, i, d.AsDuration(), u)
		}
		k := domain + "/" + ds[i]
		if last, ok := r.resets[k]; ok && d.AsDuration() > last+500*time.Millisecond {
			r.rolled = true
		}
		r.resets[k] = d.AsDuration()
	}
	if w := want(resp); !proto.Equal(resp, w) {
		r.errorf("%s: answer\n  %v\nwant\n  %v", what, resp, w)
	}
	return resp
}

// stats checks stats named relative to prefix (or absolute, starting with
// "ratelimit.").
func (r *replayRun) stats(what string, want map[string]uint64) {
	got := debugStats(r.t, r.p)
	for name, v := range want {
		if got[name] != v {
			r.errorf("%s: stat %s = %d, want %d", what, name, got[name], v)
		}
	}
}

// replayStore is the store a replayed case runs on, emptied before each
// attempt.
type replayStore interface{ flush(t *testing.T) }

// replayMemcache is a memcached for the replayed cases.
type replayMemcache struct{ s *memcachedtest.Server }

func (m replayMemcache) flush(t *testing.T) {
	t.Helper()
	if err := m.s.Do("flush_all"); err != nil {
		t.Fatalf("flush_all on %s: %v", m.s.Addr, err)
	}
}

// replayed runs a case up to three times while a window ends during it.
func replayed(t *testing.T, store replayStore, env map[string]string, run func(r *replayRun)) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		store.flush(t)
		p := start(t, env)
		r := &replayRun{t: t, p: p, resets: map[string]time.Duration{}}
		run(r)
		p.stop(t)
		if !r.rolled || attempt == 3 {
			for _, e := range r.errs {
				t.Error(e)
			}
			return
		}
		t.Logf("attempt %d: a window ended during the run; running it again", attempt)
	}
}

// TestReplayBasicConfig is the reference's TestBasicConfig: every variant it
// runs on single Redis (per-second Redis, local cache, cache key prefix,
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT) through testBasicBaseConfig.
func TestReplayBasicConfig(t *testing.T) {
	redis := startReplayRedis(t)
	for _, tc := range []struct {
		name       string
		perSecond  bool
		localCache int
		extra      map[string]string
	}{
		{"WithoutPerSecondRedis", false, 0, nil},
		{"WithPerSecondRedis", true, 0, nil},
		{"WithoutPerSecondRedisWithLocalCache", false, 1000, nil},
		{"WithPerSecondRedisWithLocalCache", true, 1000, nil},
		{"WithoutPerSecondRedisWithCachePrefix", false, 0, map[string]string{"CACHE_KEY_PREFIX": "prefix:"}},
		{"WithoutPerSecondRedisWithStopCacheKeyIncrementWhenOverlimit", false, 0, stopIncrement},
		{"WithPerSecondRedisWithStopCacheKeyIncrementWhenOverlimit", true, 0, stopIncrement},
		{"WithoutPerSecondRedisWithLocalCacheAndStopCacheKeyIncrementWhenOverlimit", false, 1000, stopIncrement},
		{"WithPerSecondRedisWithLocalCacheAndStopCacheKeyIncrementWhenOverlimit", true, 1000, stopIncrement},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := redis.env(t, tc.perSecond, tc.localCache, tc.extra)
			replayed(t, redis, env, func(r *replayRun) {
				replayBasicBase(r, tc.localCache > 0, tc.extra["STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"] == "true")
			})
			// Only the per-second limit (key1, one call) went to the
			// per-second Redis, and only with REDIS_PERSECOND; its key
			// may have expired already, its count (a script call or a
			// plain INCRBY) is counted.
			if got, want := scriptCalls(t, redis.perSecond)+commandCalls(t, redis.perSecond, "incrby") > 0, tc.perSecond; got != want {
				t.Errorf("REDIS_PERSECOND=%v: the per-second Redis counted: %v", tc.perSecond, got)
			}
		})
	}
}

var stopIncrement = map[string]string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"}

// TestReplayBasicConfigMemcache is the reference's TestBasicConfig on
// memcache (BACKEND_TYPE=memcache, MEMCACHE_HOST_PORT), with and without
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT and a cache key prefix. The
// reference's memcache store increments in the background, so its own
// test expects stale answers; this one is exact, and is held to the
// answers the reference gives on Redis.
func TestReplayBasicConfigMemcache(t *testing.T) {
	mc := replayMemcache{memcachedtest.Start(t)}
	for _, tc := range []struct {
		name  string
		extra map[string]string
	}{
		{"Plain", nil},
		{"WithCachePrefix", map[string]string{"CACHE_KEY_PREFIX": "prefix:"}},
		{"WithStopCacheKeyIncrementWhenOverlimit", stopIncrement},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := writeConfig(t, map[string]string{"basic.yaml": replayBasic, "another.yaml": replayAnother,
				"share_threshold.yaml": replayShareThreshold})
			env["USE_STATSD"], env["BACKEND_TYPE"], env["MEMCACHE_HOST_PORT"] = "false", "memcache", mc.s.Addr
			for k, v := range tc.extra {
				env[k] = v
			}
			replayed(t, mc, env, func(r *replayRun) {
				replayBasicBase(r, false, tc.extra["STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"] == "true")
			})
		})
	}
}

// replayBasicBase is the reference's testBasicBaseConfig.
func replayBasicBase(r *replayRun, local, stop bool) {
	const (
		ok   = rlsv3.RateLimitResponse_OK
		over = rlsv3.RateLimitResponse_OVER_LIMIT
	)
	key := func(k string) string { // the reference's getCacheKey
		if local {
			return k + "_local"
		}
		return k
	}
	cache := func(v uint64) uint64 { // local cache gauges: 0 without the cache
		if local {
			return v
		}
		return 0
	}
	stat := func(domain, k, s string) string {
		return "ratelimit.service.rate_limit." + domain + "." + key(k) + "." + s
	}
	const hitCount, missCount = "ratelimit.localcache.hitCount", "ratelimit.localcache.missCount"

	r.ask("unknown domain", "foo", [][2]string{{key("hello"), "world"}}, func(*rlsv3.RateLimitResponse) *rlsv3.RateLimitResponse {
		return &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: ok}}}
	})
	r.stats("after the unknown domain", map[string]uint64{hitCount: 0, missCount: 0})

	r.ask("key1", "basic", [][2]string{{key("key1"), "foo"}}, func(got *rlsv3.RateLimitResponse) *rlsv3.RateLimitResponse {
		return &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			replayStatus(ok, 50, rlsv3.RateLimitResponse_RateLimit_SECOND, 49, got.GetStatuses()[0])}}
	})
	r.stats("after key1", map[string]uint64{stat("basic", "key1", "total_hits"): 1, hitCount: 0, missCount: cache(1)})

	// Over a minute limit with a value of its own.
	v := strconv.FormatUint(rand.Uint64(), 10)
	for i := range 25 {
		code, remaining := ok, uint32(20-(i+1))
		if i >= 20 {
			code, remaining = over, 0
		}
		what := fmt.Sprintf("key2 call %d", i+1)
		r.ask(what, "another", [][2]string{{key("key2"), v}}, func(got *rlsv3.RateLimitResponse) *rlsv3.RateLimitResponse {
			return &rlsv3.RateLimitResponse{OverallCode: code, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				replayStatus(code, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, remaining, got.GetStatuses()[0])}}
		})
		want := map[string]uint64{stat("another", "key2", "total_hits"): uint64(i + 1),
			stat("another", "key2", "over_limit"): uint64(max(i-19, 0)), hitCount: 0, missCount: cache(uint64(min(i+2, 22)))}
		if i >= 20 {
			want[stat("another", "key2", "over_limit_with_local_cache")] = cache(uint64(i - 20))
			want[hitCount] = cache(uint64(i - 20))
		}
		r.stats(what, want)
	}
	// The reference's near_limit arithmetic: hits 17 to 20 of 20 (past
	// floor(20 * 0.8)); the rejected ones were already at the limit.
	r.stats("key2's near_limit", map[string]uint64{stat("another", "key2", "near_limit"): 4, stat("another", "key2", "within_limit"): 20})

	// Two limits of one domain in one request.
	v = strconv.FormatUint(rand.Uint64(), 10)
	for i := range 15 {
		code, remaining1, remaining2 := ok, uint32(20-(i+1)), uint32(10-(i+1))
		if i >= 10 {
			code, remaining2 = over, 0
			if stop { // nothing of a rejected request counted
				remaining1 = 10
			}
		}
		what := fmt.Sprintf("key2 and key3 call %d", i+1)
		r.ask(what, "another", [][2]string{{key("key2"), v}, {key("key3"), v}}, func(got *rlsv3.RateLimitResponse) *rlsv3.RateLimitResponse {
			return &rlsv3.RateLimitResponse{OverallCode: code, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				replayStatus(ok, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, remaining1, got.GetStatuses()[0]),
				replayStatus(code, 10, rlsv3.RateLimitResponse_RateLimit_HOUR, remaining2, got.GetStatuses()[1])}}
		})
		want := map[string]uint64{
			stat("another", "key2", "total_hits"): uint64(i + 26), stat("another", "key2", "over_limit"): 5,
			stat("another", "key2", "over_limit_with_local_cache"): cache(4),
			stat("another", "key3", "total_hits"):                  uint64(i + 1), stat("another", "key3", "over_limit"): uint64(max(i-9, 0)),
			stat("another", "key3", "over_limit_with_local_cache"): cache(uint64(max(i-10, 0))),
			hitCount: cache(4), missCount: cache(uint64(i*2 + 24)),
		}
		if i >= 10 {
			want[hitCount], want[missCount] = cache(uint64(i-6)), cache(uint64(i+34))
		}
		r.stats(what, want)
	}
	r.stats("key3's near_limit", map[string]uint64{stat("another", "key3", "near_limit"): 2})

	// The duration until reset counts down between two calls. The
	// reference sleeps 2 s and compares whole seconds; here it has
	// milliseconds, so the second call is asked until it is lower.
	first := r.ask("key4 first", "another", [][2]string{{key("key4"), "durTest"}}, func(got *rlsv3.RateLimitResponse) *rlsv3.RateLimitResponse {
		return &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			replayStatus(ok, 20, rlsv3.RateLimitResponse_RateLimit_DAY, 19, got.GetStatuses()[0])}}
	}).GetStatuses()[0].GetDurationUntilReset().AsDuration()
	deadline := time.Now().Add(10 * time.Second)
	for n := uint32(18); ; n-- {
		second := r.ask("key4 again", "another", [][2]string{{key("key4"), "durTest"}}, func(got *rlsv3.RateLimitResponse) *rlsv3.RateLimitResponse {
			return &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				replayStatus(ok, 20, rlsv3.RateLimitResponse_RateLimit_DAY, n, got.GetStatuses()[0])}}
		}).GetStatuses()[0].GetDurationUntilReset().AsDuration()
		if second < first {
			break
		}
		if n == 1 || time.Now().After(deadline) {
			r.errorf("key4's duration until reset did not go down: %v, then %v", first, second)
			break
		}
		time.Sleep(5 * time.Millisecond) // waiting for the clock to move, not for a result
	}
}

// TestReplayReload is the reference's TestBasicReloadConfig: a config
// file added to the watched directory is served, its removal reloads too;
// with RUNTIME_WATCH_ROOT true and false.
func TestReplayReload(t *testing.T) {
	redis := startReplayRedis(t)
	for _, watchRoot := range []string{"true", "false"} {
		t.Run("RUNTIME_WATCH_ROOT="+watchRoot, func(t *testing.T) {
			env := redis.env(t, false, 0, map[string]string{"RUNTIME_WATCH_ROOT": watchRoot})
			dir := filepath.Join(env["RUNTIME_ROOT"], "ratelimit", "config")
			replayed(t, redis, env, func(r *replayRun) {
				const ok = rlsv3.RateLimitResponse_OK
				r.ask("before the reload", "reload", [][2]string{{"block", "foo"}}, func(*rlsv3.RateLimitResponse) *rlsv3.RateLimitResponse {
					return &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: ok}}}
				})
				loads := func() uint64 { return debugStats(t, r.p)["ratelimit.service.config_load_success"] }
				before := loads()
				if err := os.WriteFile(filepath.Join(dir, "reload.yaml"), []byte(replayReload), 0o644); err != nil {
					t.Fatal(err)
				}
				eventually(t, "the added file is loaded", func() bool { return loads() > before })
				r.ask("after the reload", "reload", [][2]string{{"key1", "foo"}}, func(got *rlsv3.RateLimitResponse) *rlsv3.RateLimitResponse {
					return &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
						replayStatus(ok, 50, rlsv3.RateLimitResponse_RateLimit_SECOND, 49, got.GetStatuses()[0])}}
				})
				before = loads()
				if err := os.Remove(filepath.Join(dir, "reload.yaml")); err != nil {
					t.Fatal(err)
				}
				eventually(t, "the removal reloads", func() bool { return loads() > before })
			})
		})
	}
}

// TestReplayShareThreshold is the reference's TestShareThreshold: values
// matching a share_threshold wildcard share one counter; other wildcards
// count each value apart.
func TestReplayShareThreshold(t *testing.T) {
	redis := startReplayRedis(t)
	replayed(t, redis, redis.env(t, false, 0, nil), func(r *replayRun) {
		const domain = "share-threshold-test"
		for i := range 10 {
			resp := r.p.should(t, domain, configtest.Desc("files=files/a.pdf"))
			if c := resp.GetOverallCode(); c != rlsv3.RateLimitResponse_OK && c != rlsv3.RateLimitResponse_OVER_LIMIT {
				r.errorf("files/a.pdf call %d: %v", i+1, c)
			}
		}
		r.ask("files/b.csv", domain, [][2]string{{"files", "files/b.csv"}}, func(got *rlsv3.RateLimitResponse) *rlsv3.RateLimitResponse {
			return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				replayStatus(rlsv3.RateLimitResponse_OVER_LIMIT, 10, rlsv3.RateLimitResponse_RateLimit_HOUR, 0, got.GetStatuses()[0])}}
		})
		base := time.Now().UnixNano()
		for i := range 10 {
			v := fmt.Sprintf("files_no_share/%d-%d", base, rand.Int64())
			r.ask("a value of its own "+strconv.Itoa(i), domain, [][2]string{{"files_no_share", v}}, func(got *rlsv3.RateLimitResponse) *rlsv3.RateLimitResponse {
				return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
					replayStatus(rlsv3.RateLimitResponse_OK, 10, rlsv3.RateLimitResponse_RateLimit_HOUR, 9, got.GetStatuses()[0])}}
			})
		}
		// The shared counter's stats are named by the pattern, as the
		// reference names them.
		r.stats("files/*", map[string]uint64{"ratelimit.service.rate_limit.share-threshold-test.files_files/*.total_hits": 11,
			"ratelimit.service.rate_limit.share-threshold-test.files_files/*.over_limit": 1})
	})
}

// TestReplayExtraTags is the reference's TestBasicConfig_ExtraTags: with
// EXTRA_TAGS, a rule's statsd counters and config_load_success carry the
// tags.
func TestReplayExtraTags(t *testing.T) {
	redis := startReplayRedis(t)
	port, lines := listenStatsdTCP(t)
	env := redis.env(t, false, 0, map[string]string{"USE_STATSD": "true", "STATSD_HOST": "127.0.0.1",
		"STATSD_PORT": strconv.Itoa(port), "EXTRA_TAGS": "foo:bar,a:b", "STATS_FLUSH_INTERVAL": "100ms"})
	redis.flush(t)
	p := start(t, env)
	p.should(t, "basic", configtest.Desc("key1=foo"))
	for _, want := range []string{"ratelimit.service.rate_limit.basic.key1.total_hits.__a=b.__foo=bar:1|c",
		"ratelimit.service.config_load_success.__a=b.__foo=bar:1|c"} {
		eventually(t, "statsd gets "+want, func() bool {
			for _, l := range lines.all() {
				if l == want {
					return true
				}
			}
			return false
		})
	}
}

// The reference's example config's quota descriptors (examples/ratelimit/
// config/example.yaml), which its token-quota.sh and
// multiservice-tokenquota.sh drive through Envoy.
const replayTokenQuota = `domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
    metadata:
      service_with_quota:
        name: "service_1"
  - key: service
    value: service_2
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
    metadata:
      service_with_quota:
        name: "service_2"
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 1000
`

// quotaDesc is one descriptor as Envoy sends a rate limit action with
// hits_addend set: the per-descriptor hits_addend, 0 for a check.
func quotaDesc(kv string, hits uint64) *rlv3.RateLimitDescriptor {
	d := configtest.Desc(kv)
	d.HitsAddend = wrapperspb.UInt64(hits)
	return d
}

// TestReplayTokenQuota is the reference's integration scripts token-quota.sh
// and multiservice-tokenquota.sh, by the calls Envoy makes for them: a check
// with hits_addend 0 on the request path, the usage reported with
// apply_on_stream_done once the response is done; and 1,000 tokens an hour
// reported 300 at a time. A report past the limit counts, so checks refuse
// once reports pass it: on the embedded store and on Redis, with and
// without STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, the per-second Redis and
// the local cache, on the default settings. REJECTED_HITS=drop is this
// service's exact counting, under which a report that does not fit is
// dropped: every check then passes.
func TestReplayTokenQuota(t *testing.T) {
	redis := startReplayRedis(t)
	mc := replayMemcache{memcachedtest.Start(t)}
	for _, tc := range []struct {
		name  string
		redis bool
		extra map[string]string
	}{
		{"Memory", false, nil},
		{"Redis", true, nil},
		{"RedisPerSecond", true, map[string]string{"REDIS_PERSECOND": "true"}},
		{"RedisStopCacheKeyIncrementWhenOverlimit", true, stopIncrement},
		{"RedisLocalCache", true, map[string]string{"LOCAL_CACHE_SIZE_IN_BYTES": "100000"}},
		{"Memcache", false, map[string]string{"BACKEND_TYPE": "memcache"}},
		{"MemoryRejectedHitsDrop", false, map[string]string{"REJECTED_HITS": "drop"}},
		{"RedisRejectedHitsDrop", true, map[string]string{"REJECTED_HITS": "drop"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := writeConfig(t, map[string]string{"rl.yaml": replayTokenQuota,
				"multi.yaml": strings.Replace(replayTokenQuota, "domain: rl", "domain: multi", 1)})
			env["USE_STATSD"], env["RESPONSE_DYNAMIC_METADATA"] = "false", "true"
			if tc.redis {
				env["BACKEND_TYPE"], env["REDIS_URL"], env["REDIS_PERSECOND_URL"] = "redis", redis.main.Addr, redis.perSecond.Addr
			} else {
				env["BACKEND_TYPE"] = "memory"
			}
			for k, v := range tc.extra {
				env[k] = v
			}
			if env["BACKEND_TYPE"] == "memcache" {
				env["MEMCACHE_HOST_PORT"] = mc.s.Addr
			}
			drop := tc.extra["REJECTED_HITS"] == "drop"
			// A window ending during the run starts its counts over: a run
			// that crossed a minute is repeated on fresh counts.
			for attempt := 1; ; attempt++ {
				if tc.redis {
					redis.flush(t)
				} else if env["BACKEND_TYPE"] == "memcache" {
					mc.flush(t)
				}
				p := start(t, env)
				minute := time.Now().Truncate(time.Minute)
				errs := tokenQuotaRun(t, p, drop)
				p.stop(t)
				if time.Now().Truncate(time.Minute).Equal(minute) || attempt == 3 {
					for _, e := range errs {
						t.Error(e)
					}
					return
				}
				t.Logf("attempt %d: a minute ended during the run; running it again", attempt)
			}
		})
	}
}

// tokenQuotaRun makes the scripts' calls and returns where the answers
// differ from the reference's admissions (or, with drop, from the exact
// counting's).
func tokenQuotaRun(t *testing.T, p *proc, drop bool) []string {
	var errs []string
	check := func(what, domain string, want rlsv3.RateLimitResponse_Code, ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		resp := p.should(t, domain, ds...)
		if resp.GetOverallCode() != want {
			errs = append(errs, fmt.Sprintf("%s: %v, want %v (%v)", what, resp.GetOverallCode(), want, resp))
		}
		return resp
	}
	report := func(domain, kv string, hits uint64) { p.should(t, domain, quotaDesc(kv, hits)) }
	const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	wantAt := func(refused int) func(i int) rlsv3.RateLimitResponse_Code {
		return func(i int) rlsv3.RateLimitResponse_Code {
			if i >= refused && !drop {
				return over
			}
			return ok
		}
	}

	// 1,000 tokens an hour, reports of 300: four requests pass, the fifth
	// and sixth are refused (with drop, the fourth report never fits: usage
	// stays at 900 and every check passes).
	tokens := wantAt(5)
	for i := 1; i <= 6; i++ {
		check(fmt.Sprintf("tokens: request %d", i), "rl", tokens(i), quotaDesc("tenant=a", 0))
		report("rl", "tenant=a", 300)
	}

	// token-quota.sh: service_2 allows 2 a minute, reports of 1: requests
	// 1-3 pass, the 4th (and a 5th) is refused.
	quota := wantAt(4)
	for i := 1; i <= 5; i++ {
		check(fmt.Sprintf("token-quota.sh: request %d", i), "rl", quota(i), quotaDesc("service=service_2", 0))
		report("rl", "service=service_2", 1)
	}

	// multiservice-tokenquota.sh: both services checked, both in quota
	// mode (the request is refused only when both are over); the request
	// goes to the service the metadata names (the first that passed) and
	// its usage is reported there: service_1 serves 2, service_2 3, the
	// 6th is refused.
	wantServed := []string{"service_1", "service_1", "service_2", "service_2", "service_2", ""}
	if drop {
		// Neither report past a limit counts: service_1 serves every one.
		wantServed = []string{"service_1", "service_1", "service_1", "service_1", "service_1", "service_1"}
	}
	for i, want := range wantServed {
		code := ok
		if want == "" {
			code = over
		}
		resp := check(fmt.Sprintf("multiservice-tokenquota.sh: request %d", i+1), "multi", code,
			quotaDesc("service=service_1", 0), quotaDesc("service=service_2", 0))
		if code == over {
			continue
		}
		served := resp.GetDynamicMetadata().GetFields()["metadata"].GetStructValue().GetFields()["service_with_quota"].
			GetStructValue().GetFields()["name"].GetStringValue()
		if served != want {
			errs = append(errs, fmt.Sprintf("multiservice-tokenquota.sh: request %d served by %q, want %q (%v)", i+1, served, want, resp))
		}
		if served != "" {
			report("multi", "service="+served, 1)
		}
	}
	return errs
}
