package integration

import (
	"flag"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/redis/redistest"
	"github.com/openrls/ratelimit/src/rlqs/rlqstest"
)

var rlqsPhase = flag.Duration("rlqs.phase", 20*time.Second, "BenchmarkRLQS: the length of each of its two phases")

// BenchmarkRLQS: N fake Envoys (3, 10, 100; Envoy 1.40's client, reports
// every 5 s) against one tenant's limit of 300 per second, through the
// built binary on Redis. Each Envoy first asks for twice its even share;
// then half of them stop and the others ask as much again. Per N: the
// worst second against the limit, the share of the limit used in the
// second half of each phase, how long after the shift the fleet is back
// to 90% of what it used before, Redis script calls and the time Redis
// spent running them (INFO commandstats) per report received, and the
// service's CPU per Envoy.
func BenchmarkRLQS(b *testing.B) {
	const limit = 300
	for range b.N {
		rows := []string{fmt.Sprintf("RLQS: one limit of %d per second shared by N Envoys; two phases of %v each", limit, *rlqsPhase),
			"| Envoys | worst second | used, phase 1 | used, after the shift | back to 90% after | script calls / report | script µs / report | service CPU µs/s per Envoy |",
			"|---|---|---|---|---|---|---|---|"}
		for _, n := range []int{3, 10, 100} {
			rows = append(rows, rlqsBenchRow(b, n, limit))
			b.Log(rows[len(rows)-1])
		}
		for _, r := range rows {
			fmt.Println(r)
		}
	}
}

func rlqsBenchRow(b *testing.B, n, limit int) string {
	srv := redistest.Start(b)
	env := writeConfig(b, map[string]string{"quota.yaml": fmt.Sprintf(`
domain: quota
descriptors:
  - key: tenant
    value: acme
    rate_limit: {unit: second, requests_per_unit: %d}
`, limit)})
	env["REDIS_URL"], env["BACKEND_TYPE"], env["LOG_LEVEL"] = srv.Addr, "redis", "warn"
	p := start(b, env)
	defer p.stop(b)
	var mu sync.Mutex
	per := map[int64]int{}
	var reports atomic.Int64
	id := map[string]string{"tenant": "acme"}
	envoys := make([]*rlqstest.Envoy, n)
	for i := range envoys {
		envoys[i] = rlqstest.Start(rlqstest.Options{Conn: p.conn, Domain: "quota", NoAssignment: rlqstest.Deny,
			OnAdmit: func(_ string, at time.Time) { mu.Lock(); per[at.Unix()]++; mu.Unlock() }})
		defer envoys[i].Stop()
	}
	share := 2 * float64(limit) / float64(n)
	begin := time.Now()
	shift := begin.Add(*rlqsPhase)
	end := shift.Add(*rlqsPhase)
	calls0, busy0 := redisCalls(b, srv)
	svc0 := processCPU(p.cmd.Process.Pid)
	var wg sync.WaitGroup
	for i, e := range envoys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Phase 1: every Envoy at twice an even share; phase 2: the
			// even-numbered ones stop, the others double.
			benchPaced(e, id, share, shift)
			if i%2 == 1 {
				benchPaced(e, id, 2*share, end)
			}
		}()
	}
	wg.Wait()
	calls1, busy1 := redisCalls(b, srv)
	svc1 := processCPU(p.cmd.Process.Pid)
	elapsed := time.Since(begin)
	// Envoy 1.40 reports every 5 s from each Envoy's first request.
	reports.Store(int64(n) * int64(elapsed/(5*time.Second)))
	mu.Lock()
	defer mu.Unlock()
	worst := 0
	secs := make([]int64, 0, len(per))
	for s, c := range per {
		worst = max(worst, c)
		secs = append(secs, s)
	}
	sort.Slice(secs, func(i, j int) bool { return secs[i] < secs[j] })
	used := func(from, to time.Time) float64 {
		sum, k := 0, 0
		for s := from.Unix(); s < to.Unix(); s++ {
			sum, k = sum+per[s], k+1
		}
		return float64(sum) / float64(k*limit)
	}
	before := used(begin.Add(*rlqsPhase/2), shift)
	back := "not within the phase"
	for s := shift.Unix(); s < end.Unix(); s++ {
		if float64(per[s]) >= 0.9*before*float64(limit) {
			back = strconv.FormatInt(s-shift.Unix(), 10) + " s"
			break
		}
	}
	r := float64(reports.Load())
	return fmt.Sprintf("| %d | %d / %d | %.0f%% | %.0f%% | %s | %.2f | %.0f | %.0f |", n, worst, limit, 100*before,
		100*used(shift.Add(*rlqsPhase/2), end), back, float64(calls1-calls0)/r,
		float64((busy1-busy0).Microseconds())/r, float64((svc1-svc0).Microseconds())/elapsed.Seconds()/float64(n))
}

// benchPaced sends rate requests a second on id until end: a bounded
// count, paced by a ticker.
func benchPaced(e *rlqstest.Envoy, id map[string]string, rate float64, end time.Time) {
	t := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer t.Stop()
	bound := int(rate*time.Until(end).Seconds()) + 1
	for range bound {
		if (<-t.C).After(end) {
			return
		}
		e.Request(id)
	}
}
