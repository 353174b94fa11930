package integration

import (
	"context"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for _, p := range procs {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perProc / 4 {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					resp, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "shared", Descriptors: descs(desc("k=hot"))})
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
	return int(allowed.Load())
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
	if got := p.should(t, "shared", desc("k=a")).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("before the fault: %v", got)
	}
	srv.Stop()
	var lat []time.Duration
	for range 20 {
		start := time.Now()
		_, err := p.client().ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "shared", Descriptors: descs(desc("k=a"))})
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
		resp, err := p.client().ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "shared", Descriptors: descs(desc("k=a"))})
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
