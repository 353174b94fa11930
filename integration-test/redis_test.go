package integration

import (
	"context"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

const sharedConfig = `
domain: shared
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 40}
`

func redisEnv(t *testing.T, extra map[string]string) map[string]string {
	env := writeConfig(t, map[string]string{"shared.yaml": sharedConfig})
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// hammer sends n requests per process from several goroutines and returns
// how many were allowed.
func hammer(t *testing.T, procs []*proc, perProc int) int {
	t.Helper()
	req := &rlsv3.RateLimitRequest{Domain: "shared", Descriptors: descs(configtest.Desc("k=hot"))}
	return int(send(t, procs, req, 4, perProc/4))
}

// send has workers goroutines per process send req n times each and
// returns how many were allowed.
func send(t *testing.T, procs []*proc, req *rlsv3.RateLimitRequest, workers, n int) int64 {
	t.Helper()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for _, p := range procs {
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range n {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					resp, err := p.client().ShouldRateLimit(ctx, req)
					cancel()
					if err != nil {
						t.Error(err)
						return
					}
					if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
						allowed.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	return allowed.Load()
}

func TestRedisTwoProcessesShareOneLimit(t *testing.T) {
	srv := redistest.Start(t)
	env := redisEnv(t, map[string]string{"REDIS_URL": srv.Addr})
	procs := []*proc{start(t, env), start(t, env)}
	if got := hammer(t, procs, 60); got != 40 {
		t.Errorf("two processes, 120 requests on a limit of 40: allowed %d, want exactly 40", got)
	}
}

func TestRedisClusterTwoProcessesShareOneLimit(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	env := redisEnv(t, map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": nodes[0].Addr + "," + nodes[1].Addr})
	procs := []*proc{start(t, env), start(t, env)}
	if got := hammer(t, procs, 60); got != 40 {
		t.Errorf("cluster, two processes, 120 requests on a limit of 40: allowed %d, want exactly 40", got)
	}
}

func TestRedisKilledThenRestarted(t *testing.T) {
	srv := redistest.Start(t)
	p := start(t, redisEnv(t, map[string]string{"REDIS_URL": srv.Addr, "REDIS_TIMEOUT": "200ms", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "true"}))
	if got := p.should(t, "shared", configtest.Desc("k=a")).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("before the fault: %v", got)
	}
	srv.Stop()
	var lat []time.Duration
	for range 20 {
		start := time.Now()
		_, err := p.client().ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "shared", Descriptors: descs(configtest.Desc("k=a"))})
		lat = append(lat, time.Since(start))
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("with Redis down: error = %v, want Unavailable", err)
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("Unavailable latency with Redis down (REDIS_TIMEOUT=200ms): p50 %v, p95 %v, max %v", lat[10], lat[18], lat[19])
	waitHealth(t, p, 500)

	srv.Restart()
	waitHealth(t, p, 200)
	// The circuit breaker closes on its next probe; until then the policy
	// (error) answers. The first answer from Redis counts the first hit.
	eventually(t, "answers from the restarted Redis", func() bool {
		resp, err := p.client().ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "shared", Descriptors: descs(configtest.Desc("k=a"))})
		if err != nil {
			return false
		}
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != 39 {
			t.Fatalf("after Redis restarted empty: %v, want OK with 39 left", resp)
		}
		return true
	})
}

// waitHealth polls /healthcheck until it answers code, within a bound.
func waitHealth(t *testing.T, p *proc, code int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + p.httpAddr + "/healthcheck")
		if err == nil {
			last = readBody(resp)
			if resp.StatusCode == code {
				return
			}
		}
		time.Sleep(50 * time.Millisecond) // polling an eventually-consistent state
	}
	t.Fatalf("/healthcheck did not answer %d within 15s (last %q)", code, last)
}

// TestUsageReportsOnRedis drives the binary as an AI gateway's Envoy would
// (check with hits 0, report usage, refund with is_negative_hits) on a
// single Redis and on a Cluster.
func TestUsageReportsOnRedis(t *testing.T) {
	cfg := map[string]string{"ai.yaml": `
domain: ai
descriptors:
  - key: tenant
    overdraft: true
    rate_limits:
      - {unit: minute, requests_per_unit: 100}
      - {unit: hour, requests_per_unit: 1000, algorithm: token_bucket}
`}
	for _, tc := range []struct {
		name string
		env  func(t *testing.T) map[string]string
	}{
		{"single", func(t *testing.T) map[string]string {
			return map[string]string{"REDIS_URL": redistest.Start(t).Addr}
		}},
		{"cluster", func(t *testing.T) map[string]string {
			nodes := redistest.StartCluster(t, 3)
			return map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": nodes[0].Addr + "," + nodes[1].Addr}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := writeConfig(t, cfg)
			for k, v := range tc.env(t) {
				env[k] = v
			}
			// The default, and with the option overdraft must win over.
			for _, stop := range []string{unset, "true"} {
				env["STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"] = stop
				env["CACHE_KEY_PREFIX"] = "stop" + strings.Trim(stop, "\x00") + "_" // a fresh counter per run
				usageFlow(t, start(t, env))
			}
		})
	}
}

// usageFlow checks, on p, a check, two reports (the second past the limit)
// and a refund of tenant t on the ai domain.
func usageFlow(t *testing.T, p *proc) {
	t.Helper()
	for _, st := range []struct {
		name   string
		hits   uint64
		refund bool
		code   rlsv3.RateLimitResponse_Code
		left   uint32
	}{
		{"check", 0, false, rlsv3.RateLimitResponse_OK, 100},
		{"report 70", 70, false, rlsv3.RateLimitResponse_OK, 30},
		{"report 130: counted past the limit", 130, false, rlsv3.RateLimitResponse_OVER_LIMIT, 0},
		{"check while over", 0, false, rlsv3.RateLimitResponse_OVER_LIMIT, 0},
		{"refund 150", 150, true, rlsv3.RateLimitResponse_OK, 50},
		{"check under the limit again", 0, false, rlsv3.RateLimitResponse_OK, 50},
	} {
		d := configtest.Desc("tenant=t")
		d.HitsAddend = wrapperspb.UInt64(st.hits)
		d.IsNegativeHits = st.refund
		resp := p.should(t, "ai", d)
		if code, left := resp.GetOverallCode(), resp.GetStatuses()[0].GetLimitRemaining(); code != st.code || left != st.left {
			t.Errorf("%s: %v with %d left, want %v with %d left", st.name, code, left, st.code, st.left)
		}
	}
	if !strings.Contains(metricsBody(t, p), `ratelimit_service_rate_limit_refunded_hits{domain="ai",key="tenant.fw60"} 150`) {
		t.Errorf("/metrics does not count the refund")
	}
}

// TestSlidingLogThroughTheBinary: algorithm: sliding_log from a config
// file, on the embedded store and on Redis, with hits_addend weights.
func TestSlidingLogThroughTheBinary(t *testing.T) {
	cfg := map[string]string{"log.yaml": `
domain: log
descriptors:
  - key: login
    rate_limit: {unit: minute, unit_multiplier: 15, requests_per_unit: 5, algorithm: sliding_log}
`}
	for _, backend := range []string{"memory", "redis"} {
		t.Run(backend, func(t *testing.T) {
			env := writeConfig(t, cfg)
			env["BACKEND_TYPE"] = backend
			if backend == "redis" {
				env["REDIS_URL"] = redistest.Start(t).Addr
			}
			p := start(t, env)
			weighted := configtest.Desc("login=alice")
			weighted.HitsAddend = wrapperspb.UInt64(3)
			for i, want := range []struct {
				d    *rlv3.RateLimitDescriptor
				code rlsv3.RateLimitResponse_Code
				left uint32
			}{
				{configtest.Desc("login=alice"), rlsv3.RateLimitResponse_OK, 4},
				{weighted, rlsv3.RateLimitResponse_OK, 1},
				{weighted, rlsv3.RateLimitResponse_OVER_LIMIT, 1},
				{configtest.Desc("login=alice"), rlsv3.RateLimitResponse_OK, 0},
				{configtest.Desc("login=alice"), rlsv3.RateLimitResponse_OVER_LIMIT, 0},
			} {
				st := p.should(t, "log", want.d).GetStatuses()[0]
				if st.GetCode() != want.code || st.GetLimitRemaining() != want.left {
					t.Errorf("call %d: %v with %d left, want %v with %d left", i, st.GetCode(), st.GetLimitRemaining(), want.code, want.left)
				}
				if reset := st.GetDurationUntilReset().AsDuration(); reset <= 14*time.Minute || reset > 15*time.Minute {
					t.Errorf("call %d: duration_until_reset %v, want when the first hit leaves the 15-minute window", i, reset)
				}
			}
		})
	}
}

// toTheLimit sends 41 requests of the descriptor desc ("k=value") of
// sharedConfig (40 an hour) to p: the first 40 must be OK, the last
// OVER_LIMIT.
func toTheLimit(t *testing.T, p *proc, desc string) {
	t.Helper()
	for i := range 41 {
		want := rlsv3.RateLimitResponse_OK
		if i == 40 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if got := p.should(t, "shared", configtest.Desc(desc)).GetOverallCode(); got != want {
			t.Fatalf("request %d: %v, want %v (limit 40 an hour)", i+1, got, want)
		}
	}
}

// listedCommands are the commands docs/migrating.md says a Redis user
// needs beyond the reference's.
var listedCommands = []string{"+evalsha", "+eval", "+script|load", "+fcall", "+function|load",
	"+get", "+set", "+del", "+incrby", "+decrby", "+pexpire", "+pexpireat", "+multi", "+exec", "+time"}

// TestRedisFunctionsAsProductionRunsThem: on Redis 7 the binary loads its
// Lua code as a function library and every decision that needs the code
// (here a fixed window that drops the hits it rejects; the default fixed
// window takes plain commands, TestRedisPlainFixedWindowAsProductionRunsIt)
// is an FCALL, also for a Redis user allowed only the commands
// docs/migrating.md lists; where Redis refuses functions (an ACL without
// FUNCTION here, Redis before 7 elsewhere) it says so at start-up and every
// decision runs as a script, with the same answers.
func TestRedisFunctionsAsProductionRunsThem(t *testing.T) {
	listed := listedCommands
	for _, tc := range []struct {
		name    string
		acl     []string // rules of the service's Redis user; nil: the default user
		refused bool
	}{
		{"functions", nil, false},
		{"only the listed commands", append([]string{"-@all", "+incrby", "+expire"}, listed...), false},
		{"refused", []string{"+@all", "-function"}, true},
	} {
		refused := tc.refused
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			env := map[string]string{"REDIS_URL": srv.Addr, "REJECTED_HITS": "drop"}
			if tc.acl != nil {
				if _, err := srv.Do(append([]string{"ACL", "SETUSER", "limited", "on", ">secret", "~*"}, tc.acl...)...); err != nil {
					t.Fatal(err)
				}
				env["REDIS_AUTH"] = "limited:secret"
			}
			p := start(t, redisEnv(t, env))
			toTheLimit(t, p, "k=fn")
			stats, err := srv.CommandStats()
			if err != nil {
				t.Fatal(err)
			}
			_, fcalls := stats["fcall"]
			_, evalsha := stats["evalsha"]
			_, eval := stats["eval"]
			scripts := evalsha || eval
			said := strings.Contains(p.stderr.String(), "redis refuses Lua functions")
			if fcalls == refused || scripts != refused || said != refused {
				t.Errorf("FCALL %v, EVALSHA or EVAL %v, refusal logged %v: want the function unless refused, the script and the log line if so\n%v",
					fcalls, scripts, said, stats)
			}
		})
	}
}

// TestRedisPlainFixedWindowAsProductionRunsIt: with the default settings a
// fixed window is counted with plain commands (src/redis/plain.go), also
// for a Redis user allowed only the commands docs/migrating.md lists: one
// transaction per decision (INCRBY, PEXPIREAT, TIME), no Lua, exactly the
// limit admitted; the service counts in the window of Redis's clock, under
// that window's own key, which expires when the window ends.
func TestRedisPlainFixedWindowAsProductionRunsIt(t *testing.T) {
	srv := redistest.Start(t)
	if _, err := srv.Do(append([]string{"ACL", "SETUSER", "limited", "on", ">secret", "~*", "-@all", "+expire"}, listedCommands...)...); err != nil {
		t.Fatal(err)
	}
	p := start(t, redisEnv(t, map[string]string{"REDIS_URL": srv.Addr, "REDIS_AUTH": "limited:secret"}))
	// Until the service has read Redis's clock (TIME, at its first
	// decision; a reading slowed past 100 ms by a busy machine is read
	// again a second later), decisions take the function: warm up on
	// another value until one goes plain.
	eventually(t, "a decision counted plain, after the service read Redis's TIME", func() bool {
		if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
			t.Fatal(err)
		}
		p.should(t, "shared", configtest.Desc("k=warm"))
		stats, err := srv.CommandStats()
		if err != nil {
			t.Fatal(err)
		}
		calls, _ := redistest.ScriptCalls(stats)
		return calls == 0 && stats["incrby"].Calls == 1 && stats["exec"].Calls == 1
	})
	if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	toTheLimit(t, p, "k=plain")
	stats, err := srv.CommandStats()
	if err != nil {
		t.Fatal(err)
	}
	calls, _ := redistest.ScriptCalls(stats)
	if calls != 0 || stats["incrby"].Calls != 41 || stats["exec"].Calls != 41 || stats["time"].Calls != 41 {
		t.Errorf("script calls %d, INCRBY %d, EXEC %d, TIME %d: want no script, one transaction per request\n%v", calls,
			stats["incrby"].Calls, stats["exec"].Calls, stats["time"].Calls, stats)
	}
	var keys []string
	for _, k := range keysOn(t, srv) {
		if strings.Contains(k, "plain") {
			keys = append(keys, k)
		}
	}
	if len(keys) != 1 {
		t.Fatalf("keys %v, want the one counter of k=plain", keys)
	}
	now, err := srv.Do("TIME")
	if err != nil {
		t.Fatal(err)
	}
	secs, _ := strconv.ParseInt(strings.Fields(now)[0], 10, 64)
	if want := "|" + strconv.FormatInt(secs/3600, 10); !strings.HasSuffix(keys[0], want) {
		t.Errorf("counter %s, want Redis's window's own key (ending %q)", keys[0], want)
	}
	if n, err := srv.Do("GET", keys[0]); err != nil || n != "41" {
		t.Errorf("GET %s = %q (%v), want 41", keys[0], n, err)
	}
	pttl, err := srv.Do("PTTL", keys[0])
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := strconv.ParseInt(pttl, 10, 64)
	if left := ((secs/3600+1)*3600 - secs) * 1000; ms < left-60_000 || ms > left+1_000 {
		t.Errorf("PTTL %d ms, want the window's end, %d ms from Redis's TIME", ms, left)
	}
}

// TestHealthFollowsRedisOnlyWhenAsked: with Redis down, /healthcheck
// answers 200 by default (as the reference's), and 500 with
// REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true (TestRedisKilledThenRestarted),
// as the README's Redis flow says.
func TestHealthFollowsRedisOnlyWhenAsked(t *testing.T) {
	srv := redistest.Start(t)
	p := start(t, redisEnv(t, map[string]string{"REDIS_URL": srv.Addr, "REDIS_TIMEOUT": "200ms"}))
	srv.Stop()
	_, err := p.client().ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "shared", Descriptors: descs(configtest.Desc("k=a"))})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("with Redis down: error = %v, want Unavailable", err)
	}
	for range 3 { // the health check's own probes of Redis come and go
		resp, err := http.Get("http://" + p.httpAddr + "/healthcheck")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/healthcheck with Redis down, by default: %d, want 200", resp.StatusCode)
		}
		time.Sleep(500 * time.Millisecond) // spread over the health probes' interval
	}
}
