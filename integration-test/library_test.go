package integration

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// TestFunctionFlushCostsNoDecision: FUNCTION FLUSH again and again while
// three replicas decide on one Redis (batched, as by default): no call
// fails, the breaker never opens, and the limit admits exactly its
// budget, under BACKEND_FAILURE_POLICY=error and allow alike.
func TestFunctionFlushCostsNoDecision(t *testing.T) {
	for _, policy := range []string{"error", "allow"} {
		t.Run(policy, func(t *testing.T) {
			srv := redistest.Start(t)
			env := redisEnv(t, map[string]string{"REDIS_URL": srv.Addr, "BACKEND_FAILURE_POLICY": policy})
			procs := []*proc{start(t, env), start(t, env), start(t, env)}
			req := &rlsv3.RateLimitRequest{Domain: "shared", Descriptors: descs(configtest.Desc("k=flushed"))}
			stop := make(chan struct{})
			var flushes atomic.Int64
			go func() { // bounded: at most 200 flushes, every 5 ms
				for range 200 {
					select {
					case <-stop:
						return
					case <-time.After(5 * time.Millisecond):
					}
					if _, err := srv.Do("FUNCTION", "FLUSH"); err == nil {
						flushes.Add(1)
					}
				}
			}()
			var allowed, failed atomic.Int64
			var wg sync.WaitGroup
			for _, p := range procs {
				for range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range 40 {
							ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
							resp, err := p.client().ShouldRateLimit(ctx, req)
							cancel()
							switch {
							case err != nil:
								failed.Add(1)
							case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
								allowed.Add(1)
							}
						}
					}()
				}
			}
			wg.Wait()
			close(stop)
			if flushes.Load() == 0 {
				t.Fatal("no FUNCTION FLUSH went through during the run")
			}
			if failed.Load() != 0 || allowed.Load() != 40 {
				t.Errorf("960 calls on a limit of 40 with %d FUNCTION FLUSH: %d failed, %d admitted; want 0 failed, exactly 40 admitted",
					flushes.Load(), failed.Load(), allowed.Load())
			}
			for _, p := range procs {
				if stats := debugStats(t, p); stats["ratelimit.service.call.should_rate_limit.redis_error"] != 0 {
					t.Errorf("a replica counted %d store errors", stats["ratelimit.service.call.should_rate_limit.redis_error"])
				}
			}
		})
	}
}
