package redis

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

var (
	costDecisions = flag.Int("cost.decisions", 60000, "requests per BenchmarkRedisCost case (each bounded by -cost.duration too)")
	costDuration  = flag.Duration("cost.duration", 10*time.Second, "longest a BenchmarkRedisCost case runs")
	costCounters  = flag.Int("cost.counters", 1000000, "counters written per algorithm for used_memory_dataset")
)

// BenchmarkRedisCost (part of make bench) measures what a decision costs
// Redis, per algorithm, with 1 and 3 descriptors per request, on a single
// node and on a 3-master Cluster: the store as the service runs it
// (batched, Redis's clock), 50 callers in a closed loop over 10,000
// descriptor values, far from their limits. It prints, per decision (one
// descriptor's hit): Redis CPU (INFO cpu, every node), the time Redis spent
// in scripts (INFO commandstats), the commands run (script calls and the
// commands they made), and script calls per request (the batching); then
// the bytes a counter takes (MEMORY USAGE of one key, and
// used_memory_dataset over -cost.counters counters).
//
// A shared machine moves these figures from run to run; compare rows of
// one run.
func BenchmarkRedisCost(b *testing.B) {
	algs := []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindow, limiter.TokenBucket, limiter.SlidingLog}
	for range b.N {
		rows := []string{
			fmt.Sprintf("Redis cost per decision: 50 callers, 10,000 values per descriptor, batched, %d requests (or %v) per row", *costDecisions, *costDuration),
			"| topology | algorithm | descriptors | decisions/s | Redis CPU µs/decision | script µs/decision | commands/decision | script calls/request |",
			"|---|---|---|---|---|---|---|---|",
		}
		for _, topo := range []string{"single", "cluster"} {
			nodes, client := costTopology(b, topo)
			s := newStore(b, client, Options{Batch: true})
			for _, alg := range algs {
				for _, descs := range []int{1, 3} {
					r := costRun(b, s, nodes, alg, descs)
					rows = append(rows, fmt.Sprintf("| %s | %s | %d | %.0f | %.2f | %.2f | %.2f | %.3f |", topo, alg, descs,
						r.perSec, r.cpu, r.script, r.commands, r.callsPerRequest))
				}
			}
		}
		rows = append(rows, "", fmt.Sprintf("Bytes per counter: MEMORY USAGE of one key (descriptor keys of about 45 bytes), and used_memory_dataset over %d counters", *costCounters),
			"| algorithm | MEMORY USAGE | used_memory_dataset per counter | keys per counter |", "|---|---|---|---|")
		for _, alg := range algs {
			usage, perCounter, keys := counterBytes(b, alg)
			rows = append(rows, fmt.Sprintf("| %s | %d | %.0f | %.2f |", alg, usage, perCounter, keys))
		}
		fmt.Fprintln(os.Stdout, strings.Join(rows, "\n"))
	}
}

// costTopology starts a single node or a 3-master Cluster, and a client of
// it as the service would make.
func costTopology(b *testing.B, topo string) ([]*redistest.Server, goredis.UniversalClient) {
	b.Helper()
	var nodes []*redistest.Server
	opts := ClientOptions{Type: "single", PoolSize: 20, Timeout: testTimeout}
	if topo == "cluster" {
		nodes = redistest.StartCluster(b, 3)
		var addrs []string
		for _, n := range nodes {
			addrs = append(addrs, n.Addr)
		}
		opts.URL, opts.Type = strings.Join(addrs, ","), "cluster"
	} else {
		nodes = []*redistest.Server{redistest.Start(b)}
		opts.URL = nodes[0].Addr
	}
	c, err := NewClient(opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return nodes, c
}

type costResult struct {
	perSec, cpu, script, commands, callsPerRequest float64
}

// costRun drives s with 50 callers until -cost.decisions requests or
// -cost.duration, after a short warm-up, and reads what the nodes spent.
func costRun(b *testing.B, s *Store, nodes []*redistest.Server, alg limiter.Algorithm, descs int) costResult {
	b.Helper()
	// A fixed window counts rejected hits, as config makes it by default
	// (REJECTED_HITS=count).
	rule := limiter.Rule{Algorithm: alg, Limit: 1_000_000_000, Period: time.Hour, CountRejected: alg == limiter.FixedWindow}
	if alg == limiter.SlidingLog {
		rule.Limit = limiter.MaxLogLimit // a log's ceiling; 10,000 values keep each far below it
	}
	// drive sends requests (or runs for d); spread sends value n of each
	// descriptor at the n-th request instead of a random one, so that a
	// warm-up creates every key.
	drive := func(requests int64, d time.Duration, spread bool) (int64, time.Duration) {
		var done atomic.Int64
		deadline := time.Now().Add(d)
		began := time.Now()
		var wg sync.WaitGroup
		for c := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(c), uint64(alg)))
				hits := make([]limiter.Hit, descs)
				for n := done.Add(1); n <= requests && time.Now().Before(deadline); n = done.Add(1) {
					v := rng.IntN(10000)
					if spread {
						v = int(n % 10000)
					}
					for i := range hits {
						hits[i] = limiter.Hit{Key: fmt.Sprintf("{cost:%d:d%d:v%d}:%s", alg, i, v, alg), Rule: rule, Cost: 1}
					}
					if _, err := s.Apply(context.Background(), limiter.Batch{Hits: hits}); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		return min(done.Load(), requests), time.Since(began)
	}
	drive(10000, *costDuration, true) // connections, script cache, every key
	for _, n := range nodes {
		if _, err := n.Do("CONFIG", "RESETSTAT"); err != nil {
			b.Fatal(err)
		}
	}
	cpu0 := nodesCPU(b, nodes)
	n, took := drive(int64(*costDecisions), *costDuration, false)
	cpu := nodesCPU(b, nodes) - cpu0
	var calls, commands int
	var script time.Duration
	for _, node := range nodes {
		st := commandStats(b, node)
		for name, c := range st {
			switch name {
			case "fcall", "evalsha", "eval":
				calls += c.Calls
				script += c.Busy
				commands += c.Calls
			case "get", "set", "hget", "hset", "hincrby", "hdel", "pexpire", "del", "time":
				commands += c.Calls
			}
		}
	}
	decisions := float64(n) * float64(descs)
	return costResult{
		perSec:          decisions / took.Seconds(),
		cpu:             float64(cpu.Microseconds()) / decisions,
		script:          float64(script.Microseconds()) / decisions,
		commands:        float64(commands) / decisions,
		callsPerRequest: float64(calls) / float64(n),
	}
}

// nodesCPU is the CPU time the nodes have used so far (INFO cpu).
func nodesCPU(b *testing.B, nodes []*redistest.Server) time.Duration {
	b.Helper()
	var total time.Duration
	for _, n := range nodes {
		info, err := n.Do("INFO", "cpu")
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range cpuRE.FindAllStringSubmatch(info, -1) {
			v, _ := strconv.ParseFloat(m[1], 64)
			total += time.Duration(v * float64(time.Second))
		}
	}
	return total
}

var (
	cpuRE   = regexp.MustCompile(`used_cpu_(?:sys|user):([0-9.]+)`)
	datasRE = regexp.MustCompile(`used_memory_dataset:(\d+)`)
)

// counterBytes writes one counter per key, -cost.counters of them, on a
// fresh node and returns MEMORY USAGE of one (a descriptor key of about
// 45 bytes, as a remote address makes),
// used_memory_dataset per counter, and keys per counter.
func counterBytes(b *testing.B, alg limiter.Algorithm) (usage int, perCounter, keysPer float64) {
	b.Helper()
	srv := redistest.Start(b)
	defer srv.Stop()
	c := single(b, srv)
	s := newStore(b, c, Options{Batch: true})
	// 10 an hour: a token bucket's key then lives 6 minutes after a hit,
	// longer than the run.
	rule := limiter.Rule{Algorithm: alg, Limit: 10, Period: time.Hour, CountRejected: alg == limiter.FixedWindow}
	suffix := [...]string{"fw", "sw", "tb", "sl"}[alg] + "3600" // as config names a limit of one hour
	base := dataset(b, srv)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(*costCounters); i = next.Add(1) {
				addr := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
				h := []limiter.Hit{{Key: fmt.Sprintf("{7:example14:remote_address%d:%s}:%s", len(addr), addr, suffix), Rule: rule, Cost: 1}}
				if _, err := s.Apply(context.Background(), limiter.Batch{Hits: h}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	perCounter = float64(dataset(b, srv)-base) / float64(*costCounters)
	keys, err := srv.Do("DBSIZE")
	if err != nil {
		b.Fatal(err)
	}
	nk, _ := strconv.Atoi(keys)
	key := keyVersion + "{7:example14:remote_address8:10.0.0.1}:" + suffix
	u, err := srv.Do("MEMORY", "USAGE", key)
	if err != nil {
		b.Fatal(err)
	}
	usage, _ = strconv.Atoi(u)
	return usage, perCounter, float64(nk) / float64(*costCounters)
}

// dataset is a node's used_memory_dataset.
func dataset(b *testing.B, srv *redistest.Server) int {
	b.Helper()
	info, err := srv.Do("INFO", "memory")
	if err != nil {
		b.Fatal(err)
	}
	m := datasRE.FindStringSubmatch(info)
	if m == nil {
		b.Fatalf("no used_memory_dataset in INFO memory")
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
