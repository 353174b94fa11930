package integration

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// The hot-key benchmark (`make bench`): one key that every request hits,
// with and without lease: true, on one and on two service processes
// sharing one Redis, against the embedded store. Loopback only; every
// loop is bounded by its duration.
var (
	hotDuration = flag.Duration("hotkey.duration", 10*time.Second, "measured time per hot-key target far from its limit, in turns")
	hotOver     = flag.Duration("hotkey.over", 60*time.Second, "time of the run at 3x the limit, per target (whole seconds)")
	hotLimit    = flag.Int("hotkey.limit", 2000, "per-second limit of the run at 3x the limit")
)

func hotConfig(limit int) string {
	return fmt.Sprintf(`
domain: hot
descriptors:
  - key: far
    value: leased
    rate_limit: {unit: hour, requests_per_unit: 4000000000, lease: true}
  - key: far
    value: plain
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
  - key: over
    value: leased
    rate_limit: {unit: second, requests_per_unit: %d, lease: true}
  - key: over
    value: plain
    rate_limit: {unit: second, requests_per_unit: %d}
`, limit, limit)
}

// hotTarget is one or more service processes, on Redis or not.
type hotTarget struct {
	name  string
	procs []*proc
	redis *redistest.Server
	conns []*grpc.ClientConn
}

func (h *hotTarget) cpu() time.Duration {
	var d time.Duration
	for _, p := range h.procs {
		d += processCPU(p.cmd.Process.Pid)
	}
	return d
}

// hotRun is what one run on a target saw.
type hotRun struct {
	n, allowed, errors int
	elapsed            time.Duration
	calls              int
	redisCPU, svcCPU   time.Duration
}

// drive sends requests for key=value from callers spread over the
// target's connections, closed loop or at a fixed total rate, for d.
func (h *hotTarget) drive(b testing.TB, key, value string, callers int, rate int, d time.Duration) hotRun {
	req := &rlsv3.RateLimitRequest{Domain: "hot", Descriptors: descs(configtest.Desc(key + "=" + value))}
	startCalls, _ := redisCalls(b, h.redis)
	startRedis, startSvc := redisCPU(b, h.redis), h.cpu()
	var mu sync.Mutex
	var out hotRun
	var wg sync.WaitGroup
	begin := time.Now()
	deadline := begin.Add(d)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := rlsv3.NewRateLimitServiceClient(h.conns[c%len(h.conns)])
			var tick *time.Ticker
			if rate > 0 {
				period := time.Duration(float64(time.Second) * float64(callers) / float64(rate))
				time.Sleep(period * time.Duration(c) / time.Duration(callers))
				tick = time.NewTicker(period)
				defer tick.Stop()
			}
			var n, allowed, errs int
			for time.Now().Before(deadline) {
				if tick != nil {
					<-tick.C
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := client.ShouldRateLimit(ctx, req)
				cancel()
				n++
				switch {
				case err != nil:
					errs++
				case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
					allowed++
				}
			}
			mu.Lock()
			out.n, out.allowed, out.errors = out.n+n, out.allowed+allowed, out.errors+errs
			mu.Unlock()
		}()
	}
	wg.Wait()
	out.elapsed = time.Since(begin)
	endCalls, _ := redisCalls(b, h.redis)
	out.calls = endCalls - startCalls
	out.redisCPU, out.svcCPU = redisCPU(b, h.redis)-startRedis, h.cpu()-startSvc
	return out
}

func (r *hotRun) add(o hotRun) {
	r.n, r.allowed, r.errors, r.calls = r.n+o.n, r.allowed+o.allowed, r.errors+o.errors, r.calls+o.calls
	r.elapsed, r.redisCPU, r.svcCPU = r.elapsed+o.elapsed, r.redisCPU+o.redisCPU, r.svcCPU+o.svcCPU
}

func BenchmarkHotKey(b *testing.B) {
	for range b.N {
		cfg := writeConfig(b, map[string]string{"hot.yaml": hotConfig(*hotLimit)})
		env := merge(cfg, map[string]string{"LOG_LEVEL": "warn"})
		target := func(name string, replicas int, withRedis bool) *hotTarget {
			h := &hotTarget{name: name}
			e := merge(env, map[string]string{"BACKEND_TYPE": "memory"})
			if withRedis {
				h.redis = redistest.Start(b)
				e = merge(env, map[string]string{"REDIS_URL": h.redis.Addr, "REDIS_POOL_SIZE": "20"})
			}
			for range replicas {
				p := start(b, e)
				h.procs = append(h.procs, p)
				for range *loadConns {
					c, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { c.Close() })
					h.conns = append(h.conns, c)
				}
			}
			return h
		}
		memory := target("embedded store, 1 process", 1, false)
		// A second process alike: its ratio to the first is what the
		// machine alone moves the ratios by (an A/A control).
		control := target("embedded store, 1 process (control)", 1, false)
		memory2 := target("embedded store, 2 processes", 2, false) // each its own count: the throughput two replicas could reach
		one := target("redis, 1 replica", 1, true)
		two := target("redis, 2 replicas", 2, true)

		// Far from the limit: closed loop, the targets and lease settings
		// taking turns so that a slow spell of the machine hits all alike.
		type run struct {
			t     *hotTarget
			value string
		}
		// Each leased run right after the embedded store it is compared
		// with, so that the by-turn ratios compare neighbours in time.
		runs := []run{{memory, "plain"}, {one, "leased"}, {control, "plain"}, {one, "plain"},
			{memory2, "plain"}, {two, "leased"}, {two, "plain"}}
		sums := make([]hotRun, len(runs))
		turns := make([][]loadResult, len(runs)) // req/s by turn
		rounds := max(1, *loadRounds)
		for round := range rounds {
			for i, r := range runs {
				warm := 300 * time.Millisecond
				if round == 0 {
					warm = *loadWarmup
				}
				r.t.drive(b, "far", r.value, *loadCallers, 0, warm)
				wait := func() {}
				if round == 0 { // -load.pprof: the first process of each run
					wait = saveProfile(b, r.t.procs[0].debugAddr, fmt.Sprintf("hotkey-%s-lease=%v", r.t.name, r.value == "leased"), *hotDuration/time.Duration(rounds))
				}
				got := r.t.drive(b, "far", r.value, *loadCallers, 0, *hotDuration/time.Duration(rounds))
				wait()
				sums[i].add(got)
				turns[i] = append(turns[i], loadResult{perSec: float64(got.n) / got.elapsed.Seconds()})
			}
		}
		rows := []string{fmt.Sprintf("hot key, far from its limit: %d callers (closed loop), %v per target in %d turns", *loadCallers, *hotDuration, rounds),
			"| target | lease | req/s | ratio to embedded (same processes; by turn) | script calls/req | Redis CPU µs/req | service CPU µs/req | errors |",
			"|---|---|---|---|---|---|---|---|"}
		rate := func(s hotRun) float64 { return float64(s.n) / s.elapsed.Seconds() }
		for i, r := range runs {
			s := sums[i]
			perSec := float64(s.n) / s.elapsed.Seconds()
			// The embedded store on as many processes (the control is
			// measured against the first).
			bi := slices.IndexFunc(runs, func(x run) bool { return x.t.redis == nil && len(x.t.procs) == len(r.t.procs) })
			spread := ""
			if i != bi {
				spread = turnRange(turns[i], turns[bi], func(x loadResult) float64 { return x.perSec })
			}
			perReq := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(max(s.n, 1)) }
			rows = append(rows, fmt.Sprintf("| %s | %v | %.0f | %.2f%s | %.4f | %.2f | %.1f | %d |", r.t.name, r.value == "leased", perSec, perSec/rate(sums[bi]), spread,
				float64(s.calls)/float64(max(s.n, 1)), perReq(s.redisCPU), perReq(s.svcCPU), s.errors))
			b.Log(rows[len(rows)-1])
		}

		// At three times the limit, at a fixed rate, within whole seconds
		// (10 ms after one edge to 90 ms before the last): admitted /
		// (limit x seconds). Each second is saturated in its first third.
		secs := max(1, int(*hotOver/time.Second))
		rows = append(rows, "", fmt.Sprintf("hot key at 3x its limit of %d/s for %d s (fixed rate %d req/s)", *hotLimit, secs, 3**hotLimit),
			"| target | lease | admitted / limit | script calls/req | Redis CPU µs/req | errors |", "|---|---|---|---|---|---|")
		for _, r := range runs {
			if r.t.redis == nil {
				continue // the embedded store's count is each process's own
			}
			time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 10*time.Millisecond)))
			s := r.t.drive(b, "over", r.value, *loadCallers, 3**hotLimit, time.Duration(secs)*time.Second-100*time.Millisecond)
			rows = append(rows, fmt.Sprintf("| %s | %v | %.4f | %.4f | %.2f | %d |", r.t.name, r.value == "leased",
				float64(s.allowed)/float64(*hotLimit*secs), float64(s.calls)/float64(max(s.n, 1)),
				float64(s.redisCPU)/float64(time.Microsecond)/float64(max(s.n, 1)), s.errors))
			b.Log(rows[len(rows)-1])
		}
		fmt.Fprintln(os.Stdout, strings.Join(rows, "\n"))
	}
}
