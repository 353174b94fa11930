package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// heavyConfig gives one descriptor 100 limits (windows of 1 to 100 s), so
// that a request of 64 such descriptors asks for 6,400 counters, and a
// light descriptor one.
func heavyConfig() string {
	var b strings.Builder
	b.WriteString("domain: fate\ndescriptors:\n  - key: light\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n  - key: heavy\n    rate_limits:\n")
	for i := 1; i <= 100; i++ {
		fmt.Fprintf(&b, "      - {unit: second, unit_multiplier: %d, requests_per_unit: 1000000}\n", i)
	}
	b.WriteString("  - key: some\n    rate_limits:\n")
	for i := 1; i <= 4; i++ {
		fmt.Fprintf(&b, "      - {unit: second, unit_multiplier: %d, requests_per_unit: 1000000}\n", i)
	}
	return b.String()
}

// TestHeavyClientsDoNotFailLightOnes: four clients send the heaviest
// requests the config allows while a light load runs; the light load sees
// no error. A request of 6,400 counters is refused cheaply
// (REQUEST_MAX_KEYS); one of 256 is served, alone, beside the batches of
// light decisions, which it can neither slow past their timeout nor fail.
func TestHeavyClientsDoNotFailLightOnes(t *testing.T) {
	srv := redistest.Start(t)
	env := writeConfig(t, map[string]string{"fate.yaml": heavyConfig()})
	env["REDIS_URL"] = srv.Addr
	p := start(t, env)

	many := func(key string, n int) []*rlv3.RateLimitDescriptor {
		out := make([]*rlv3.RateLimitDescriptor, n)
		for i := range out {
			out[i] = configtest.Desc(fmt.Sprintf("%s=v%d", key, i))
		}
		return out
	}
	huge := &rlsv3.RateLimitRequest{Domain: "fate", Descriptors: many("heavy", 64)} // 6,400 counters
	big := &rlsv3.RateLimitRequest{Domain: "fate", Descriptors: many("some", 64)}   // 256 counters

	ctx, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	var wg sync.WaitGroup
	var hugeRefused, bigServed, lightOK atomic.Int64
	var lightErrs sync.Map
	for range 4 {
		wg.Add(1)
		go func() { // a heavy client, bounded by time and count
			defer wg.Done()
			for i := 0; i < 400 && ctx.Err() == nil; i++ {
				req := huge
				if i%2 == 1 {
					req = big
				}
				c, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := p.client().ShouldRateLimit(c, req)
				cancel()
				switch {
				case req == huge && status.Code(err) == codes.InvalidArgument:
					hugeRefused.Add(1)
				case req == big && err == nil:
					bigServed.Add(1)
				}
			}
		}()
	}
	for g := range 4 {
		wg.Add(1)
		go func() { // the light load
			defer wg.Done()
			for i := 0; i < 2000 && ctx.Err() == nil; i++ {
				c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err := p.client().ShouldRateLimit(c, &rlsv3.RateLimitRequest{Domain: "fate", Descriptors: descs(configtest.Desc(fmt.Sprintf("light=%d-%d", g, i)))})
				cancel()
				if err != nil {
					lightErrs.Store(status.Code(err).String()+": "+status.Convert(err).Message(), true)
					continue
				}
				lightOK.Add(1)
			}
		}()
	}
	wg.Wait()
	lightErrs.Range(func(k, _ any) bool {
		t.Errorf("a light request failed while heavy clients ran: %v", k)
		return true
	})
	if hugeRefused.Load() == 0 || bigServed.Load() == 0 || lightOK.Load() == 0 {
		t.Errorf("6,400-counter requests refused %d, 256-counter requests served %d, light requests served %d: want each above 0",
			hugeRefused.Load(), bigServed.Load(), lightOK.Load())
	}
	t.Logf("light requests served %d; heavy: %d refused, %d served", lightOK.Load(), hugeRefused.Load(), bigServed.Load())
}
