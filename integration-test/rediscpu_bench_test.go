package integration

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/redis/redistest"
)

// BenchmarkRedisCPU (part of make bench) is what a decision costs Redis
// when the built binary runs as users run it: the service and the load
// generator pinned to CPU 0, Redis alone on CPU 1 (see -load.pin; the
// header says when it could not pin), 50 callers in a closed loop over 4
// gRPC connections, 10,000 values per descriptor, far from their limits,
// the default settings. A row per algorithm, with 1 and 3 descriptors per
// request (all of that algorithm), on a single Redis and on a 3-master
// Cluster (its three nodes share CPU 1), the fixed window per hour, minute
// and second; with -rediscpu.reference, an
// envoyproxy/ratelimit binary on its own single Redis beside them, on the
// fixed-window rows (the only algorithm it has); with -rediscpu.baseline,
// other builds of this service, each on its own single Redis. The targets take turns,
// -rediscpu.rounds slices each, so a slow spell of the machine hits all of
// them alike. Per decision (one descriptor's hit): Redis CPU (INFO cpu,
// every node), the part in scripts (INFO commandstats), and the decisions
// one Redis core gives at that cost; per request, script calls (the
// batching) and every command Redis ran (a script's own commands
// included; the reference's are all plain commands).
//
//	go test ./integration-test -run '^$' -bench RedisCPU -benchtime 1x -args -rediscpu.duration=8s
var (
	redisCPUDuration  = flag.Duration("rediscpu.duration", 6*time.Second, "measured time per target and row")
	redisCPURounds    = flag.Int("rediscpu.rounds", 3, "slices the measured time is cut into, the targets taking turns")
	redisCPUReference = flag.String("rediscpu.reference", "", "an envoyproxy/ratelimit server binary to measure beside this service, on the fixed-window rows")
	redisCPUBaseline  = flag.String("rediscpu.baseline", "", "server binaries of other builds, comma-separated, to measure beside this one on a single Redis each (\"single, baseline\", \"single, baseline 2\", ...), to compare builds in one run")
	redisCPUAlgs      = flag.String("rediscpu.algorithms", "", "run only rows whose algorithm matches this regular expression")
)

// redisCPUConfig has a key per algorithm, each limit far above the load
// (a sliding log's and a concurrency limit's at their largest, 1,000: a
// value gets a few dozen hits; the load takes slots and never releases
// them, so a concurrency key costs what a sliding log's does).
const redisCPUConfig = `
domain: bench
descriptors:
  - key: fixed_window
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: fixed_window_minute
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
  - key: fixed_window_second
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: sliding_window
    rate_limit: {unit: hour, requests_per_unit: 1000000000, algorithm: sliding_window}
  - key: token_bucket
    rate_limit: {unit: hour, requests_per_unit: 1000000000, algorithm: token_bucket}
  - key: sliding_log
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: sliding_log}
  - key: concurrency
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: concurrency}
`

// redisCPUReferenceConfig is the fixed-window key alone, in the form
// envoyproxy/ratelimit reads (it knows no algorithm field).
const redisCPUReferenceConfig = `
domain: bench
descriptors:
  - key: fixed_window
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: fixed_window_minute
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
  - key: fixed_window_second
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`

func BenchmarkRedisCPU(b *testing.B) {
	placement := pinGenerator(b)
	onlyAlgs := mustCompile(b, *redisCPUAlgs)
	for range b.N {
		env := merge(writeConfig(b, map[string]string{"bench.yaml": redisCPUConfig}), map[string]string{"LOG_LEVEL": "warn", "REDIS_POOL_SIZE": "20"})
		single := redistest.Start(b)
		nodes := redistest.StartCluster(b, 3)
		targets := []loadTarget{
			startTarget(b, "single", merge(env, map[string]string{"REDIS_URL": single.Addr}), []*redistest.Server{single}),
			startTarget(b, "cluster", merge(env, map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": nodes[0].Addr + "," + nodes[1].Addr}), nodes),
		}
		for i, bin := range strings.Split(*redisCPUBaseline, ",") {
			if bin = strings.TrimSpace(bin); bin == "" {
				continue
			}
			name := "single, baseline"
			if i > 0 {
				name = fmt.Sprintf("single, baseline %d", i+1)
			}
			base := redistest.Start(b)
			targets = append(targets, startTarget(b, name, merge(env, map[string]string{binaryKey: bin, "REDIS_URL": base.Addr}), []*redistest.Server{base}))
		}
		if *redisCPUReference != "" {
			ref := redistest.Start(b)
			refEnv := merge(writeConfig(b, map[string]string{"bench.yaml": redisCPUReferenceConfig}), map[string]string{
				binaryKey: *redisCPUReference, "LOG_LEVEL": "warn", "REDIS_URL": ref.Addr, "REDIS_SOCKET_TYPE": "tcp",
				"USE_STATSD": "false", "REDIS_POOL_SIZE": "20"})
			targets = append(targets, startTarget(b, "envoyproxy/ratelimit", refEnv, []*redistest.Server{ref}))
		}
		rows := []string{
			fmt.Sprintf("Redis CPU per decision, the binary: %d callers (closed loop) over %d connections, %d values per descriptor, %v per target and row in %d turns; %s",
				*loadCallers, *loadConns, *loadKeys, *redisCPUDuration, *redisCPURounds, placement),
			"| algorithm | descriptors | Redis | req/s | Redis CPU µs/decision | script µs/decision | calls/request | commands/request | decisions/s per Redis core |",
			"|---|---|---|---|---|---|---|---|---|",
		}
		// The fixed window per hour, minute and second: with 10,000 values
		// a per-second window's count is nearly always its key's first.
		for _, alg := range []string{"fixed_window", "fixed_window_minute", "fixed_window_second", "sliding_window", "token_bucket", "sliding_log", "concurrency"} {
			if !onlyAlgs.MatchString(alg) {
				continue
			}
			for _, descs := range []int{1, 3} {
				spec := loadSpec{name: fmt.Sprintf("%s, %d descriptors", alg, descs), descs: descs, key: alg}
				var sessions []*loadSession
				for _, tg := range targets {
					if tg.name == "envoyproxy/ratelimit" && !strings.HasPrefix(alg, "fixed_window") {
						continue
					}
					sessions = append(sessions, newLoadSession(b, tg, spec))
				}
				samples := make([]sample, len(sessions))
				slice := *redisCPUDuration / time.Duration(max(1, *redisCPURounds))
				for round := range max(1, *redisCPURounds) {
					for i, ls := range sessions {
						warm := 300 * time.Millisecond
						if round == 0 {
							warm = *loadWarmup // creates the keys, fills the connections
						}
						ls.run(b, warm, false)
						samples[i].add(ls.run(b, slice, true))
					}
				}
				for i, ls := range sessions {
					r := samples[i].result()
					if r.errors > 0 {
						b.Errorf("%s on %s: %d errors", spec.name, ls.tg.name, r.errors)
					}
					perDecision := r.cpuRedis / float64(descs)
					rows = append(rows, fmt.Sprintf("| %s | %d | %s | %.0f | %.2f | %.2f | %.2f | %.2f | %.0f |", alg, descs, ls.tg.name, r.perSec,
						perDecision, r.scriptPerRequest/float64(descs), r.redisCmdsPerRequest, r.commandsPerRequest, 1e6/perDecision))
				}
			}
		}
		fmt.Fprintln(os.Stdout, strings.Join(rows, "\n"))
	}
}
