package integration

import (
	"context"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// answer is one call's result during a fault.
type answer struct {
	code    codes.Code
	overall rlsv3.RateLimitResponse_Code
	took    time.Duration
}

// probe makes n sequential calls and returns their answers.
func probe(t *testing.T, p *proc, n int, key string) []answer {
	t.Helper()
	out := make([]answer, n)
	for i := range out {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		resp, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "shared", Descriptors: descs(configtest.Desc("k=" + key))})
		cancel()
		out[i] = answer{code: status.Code(err), overall: resp.GetOverallCode(), took: time.Since(start)}
	}
	return out
}

// percentiles logs p50/p99/max of the answers' latencies.
func percentiles(t *testing.T, what string, as []answer) {
	t.Helper()
	d := make([]time.Duration, len(as))
	for i, a := range as {
		d[i] = a.took
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	t.Logf("%s: %d calls, p50 %v, p99 %v, max %v", what, len(d), d[len(d)/2], d[len(d)*99/100], d[len(d)-1])
}

var goroutinesRE = regexp.MustCompile(`(?m)^go_goroutines (\d+)`)

func goroutines(t *testing.T, p *proc) int {
	t.Helper()
	m := goroutinesRE.FindStringSubmatch(metricsBody(t, p))
	if m == nil {
		t.Fatal("no go_goroutines in /metrics")
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// checkNoGrowth logs goroutines before and after a fault and fails on a
// clear leak (the slack covers connection pools refilling).
func checkNoGrowth(t *testing.T, p *proc, before int) {
	t.Helper()
	after := goroutines(t, p)
	t.Logf("goroutines: %d before the fault, %d after recovery", before, after)
	if after > before+20 {
		t.Errorf("goroutines grew from %d to %d across the fault", before, after)
	}
}

func allAnswered(t *testing.T, as []answer, want rlsv3.RateLimitResponse_Code) {
	t.Helper()
	for i, a := range as {
		if a.code != codes.OK || a.overall != want {
			t.Fatalf("call %d during the fault: %v/%v, want %v", i, a.code, a.overall, want)
		}
	}
}

// recovered waits until a call with key is answered OK and counted in one
// of the Redis servers (a failure policy can answer OK too, so the counter
// is the proof).
func recovered(t *testing.T, p *proc, key string, servers ...*redistest.Server) {
	t.Helper()
	eventually(t, "service answers from Redis again", func() bool {
		a := probe(t, p, 1, key)[0]
		if a.code != codes.OK || a.overall != rlsv3.RateLimitResponse_OK {
			return false
		}
		for _, s := range servers {
			if keys, err := s.Do("KEYS", "*:"+key+"}*"); err == nil && keys != "" {
				return true
			}
		}
		return false
	})
}

func TestChaosRedisKilledPolicies(t *testing.T) {
	tests := []struct {
		policy string
		code   codes.Code
		want   rlsv3.RateLimitResponse_Code
	}{
		{"error", codes.Unavailable, 0},
		{"allow", codes.OK, rlsv3.RateLimitResponse_OK},
		{"deny", codes.OK, rlsv3.RateLimitResponse_OVER_LIMIT},
		{"local", codes.OK, rlsv3.RateLimitResponse_OK},
	}
	for _, tc := range tests {
		t.Run(tc.policy, func(t *testing.T) {
			srv := redistest.Start(t)
			p := start(t, redisEnv(t, map[string]string{"REDIS_URL": srv.Addr, "REDIS_TIMEOUT": "200ms", "BACKEND_FAILURE_POLICY": tc.policy}))
			probe(t, p, 1, "warm")
			before := goroutines(t, p)
			srv.Stop()
			as := probe(t, p, 40, "k") // the limit is 40: local must not reject yet
			percentiles(t, "redis killed, policy "+tc.policy, as)
			for i, a := range as {
				if a.code != tc.code || a.code == codes.OK && a.overall != tc.want {
					t.Fatalf("call %d: %v/%v, want %v/%v", i, a.code, a.overall, tc.code, tc.want)
				}
			}
			if tc.policy == "local" {
				// The fallback still limits: 40 per hour, counted per replica.
				as := probe(t, p, 45, "local")
				if a := as[44]; a.overall != rlsv3.RateLimitResponse_OVER_LIMIT {
					t.Errorf("local fallback let call 45 of 40 pass")
				}
			}
			srv.Restart()
			recovered(t, p, "after", srv)
			checkNoGrowth(t, p, before)
		})
	}
}

func TestChaosRedisPausedThenResumed(t *testing.T) {
	srv := redistest.Start(t)
	p := start(t, redisEnv(t, map[string]string{"REDIS_URL": srv.Addr, "REDIS_TIMEOUT": "200ms", "BACKEND_FAILURE_POLICY": "allow",
		"CIRCUIT_BREAKER_FAILURES": "3", "CIRCUIT_BREAKER_PROBE_INTERVAL": "100ms"}))
	probe(t, p, 1, "warm")
	before := goroutines(t, p)
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	as := probe(t, p, 200, "k")
	percentiles(t, "redis paused (SIGSTOP), REDIS_TIMEOUT=200ms, breaker after 3", as)
	allAnswered(t, as, rlsv3.RateLimitResponse_OK)
	slow := 0
	for _, a := range as {
		if a.took >= 150*time.Millisecond {
			slow++
		}
	}
	t.Logf("%d of %d calls waited for the timeout before the breaker opened", slow, len(as))
	if slow > 3+3 { // the breaker must stop the waiting after 3 failures (plus calls in flight)
		t.Errorf("%d calls waited for Redis's timeout; the circuit breaker should have answered them at once", slow)
	}
	if !strings.Contains(p.stderr.String(), "circuit breaker open") {
		t.Errorf("no log line for the breaker opening")
	}
	mid := goroutines(t, p)
	t.Logf("goroutines while Redis is paused: %d", mid)
	if mid > before+20 {
		t.Errorf("goroutines piled up while Redis was paused: %d -> %d", before, mid)
	}
	srv.Resume()
	resumed = true
	recovered(t, p, "after", srv)
	checkNoGrowth(t, p, before)
}

func TestChaosSentinelFailover(t *testing.T) {
	st := redistest.StartSentinel(t)
	p := start(t, redisEnv(t, map[string]string{"REDIS_TYPE": "sentinel", "REDIS_URL": st.MasterName + "," + strings.Join(st.SentinelAddrs(), ","),
		"REDIS_TIMEOUT": "200ms", "BACKEND_FAILURE_POLICY": "allow", "CIRCUIT_BREAKER_PROBE_INTERVAL": "100ms"}))
	probe(t, p, 1, "warm")
	st.Master.Stop()
	as := probe(t, p, 30, "k")
	percentiles(t, "sentinel master killed", as)
	allAnswered(t, as, rlsv3.RateLimitResponse_OK)
	// The sentinels promote the replica (down-after 1s); the client follows.
	eventually(t, "replica promoted", func() bool {
		role, _ := st.Replica.Do("ROLE")
		return strings.HasPrefix(role, "master")
	})
	recovered(t, p, "after", st.Replica)
	// go-redis's own lines about the switch come out through the service's
	// logger, not the standard library's.
	logs := p.stderr.String()
	if !strings.Contains(logs, "component=go-redis") || !strings.Contains(logs, "sentinel:") {
		t.Errorf("no go-redis Sentinel line in the service's log format:\n%s", logs)
	}
	for _, line := range strings.Split(logs, "\n") {
		if strings.HasPrefix(line, "redis: ") {
			t.Errorf("go-redis logged past the service's logger: %q", line)
		}
	}
}

func TestChaosClusterNodeKilled(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	p := start(t, redisEnv(t, map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": nodes[0].Addr + "," + nodes[1].Addr,
		"REDIS_TIMEOUT": "200ms", "BACKEND_FAILURE_POLICY": "deny", "CIRCUIT_BREAKER_PROBE_INTERVAL": "100ms"}))
	probe(t, p, 1, "warm")
	before := goroutines(t, p)
	nodes[2].Stop()
	// Keys on the dead node's slots fail (and, once the cluster marks the
	// node failed, every slot does); each failure is answered by policy.
	var as []answer
	for i := range 30 {
		as = append(as, probe(t, p, 1, "key"+strconv.Itoa(i))...)
	}
	percentiles(t, "cluster master killed", as)
	denied := 0
	for i, a := range as {
		if a.code != codes.OK {
			t.Fatalf("call %d: %v, want an answer by policy", i, a.code)
		}
		if a.overall == rlsv3.RateLimitResponse_OVER_LIMIT {
			denied++
		}
	}
	t.Logf("%d of %d calls denied by policy while a master was down", denied, len(as))
	if denied == 0 {
		t.Errorf("no call hit the dead master's slots")
	}
	nodes[2].Restart()
	eventually(t, "cluster ok again", func() bool {
		info, _ := nodes[0].Do("CLUSTER", "INFO")
		return strings.Contains(info, "cluster_state:ok")
	})
	for i := range 30 {
		recovered(t, p, "again"+strconv.Itoa(i), nodes...)
	}
	checkNoGrowth(t, p, before)
}
