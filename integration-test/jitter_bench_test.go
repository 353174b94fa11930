package integration

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// BenchmarkExpiryJitterRedisMemory measures what EXPIRATION_JITTER_MAX_SECONDS
// costs Redis: 10,000 distinct values hit once each through the binary, on
// a per-second and a per-minute rule, with jitter 0, 10 and 300 s; then
// the keys Redis holds and its used_memory, right after the load and 3 s
// later (when a per-second window's keys have expired unless jitter keeps
// them), and Redis's CPU for the whole run.
func BenchmarkExpiryJitterRedisMemory(b *testing.B) {
	const values = 10000
	for _, unit := range []string{"second", "minute"} {
		for _, jitter := range []int{0, 10, 300} {
			b.Run(fmt.Sprintf("%s/jitter=%ds", unit, jitter), func(b *testing.B) {
				for range b.N {
					srv := redistest.Start(b)
					env := writeConfig(b, map[string]string{"j.yaml": `
domain: j
descriptors:
  - key: v
    rate_limit: {unit: ` + unit + `, requests_per_unit: 100}
`})
					env["REDIS_URL"] = srv.Addr
					env["EXPIRATION_JITTER_MAX_SECONDS"] = strconv.Itoa(jitter)
					p := start(b, env)
					cpu0 := redisCPU(b, srv)
					for i := 0; i < values; i++ {
						p.should(b, "j", configtest.Desc("v="+strconv.Itoa(i)))
					}
					keys, mem := redisKeysAndMemory(b, srv)
					time.Sleep(3 * time.Second) // a measurement's wait, not a test's
					keysLater, memLater := redisKeysAndMemory(b, srv)
					b.ReportMetric(float64(keys), "keys")
					b.ReportMetric(float64(mem)/(1<<20), "MiB")
					b.ReportMetric(float64(keysLater), "keys-3s-later")
					b.ReportMetric(float64(memLater)/(1<<20), "MiB-3s-later")
					b.ReportMetric((redisCPU(b, srv) - cpu0).Seconds(), "redis-cpu-s")
				}
			})
		}
	}
}

func redisKeysAndMemory(b *testing.B, srv *redistest.Server) (int, int) {
	n, _ := srv.Do("DBSIZE")
	info, _ := srv.Do("INFO", "memory")
	keys, _ := strconv.Atoi(strings.TrimSpace(n))
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			mem, _ := strconv.Atoi(v)
			return keys, mem
		}
	}
	b.Fatalf("no used_memory in INFO memory")
	return 0, 0
}
