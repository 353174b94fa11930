package integration

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/openrls/ratelimit/src/redis/redistest"
)

// The load benchmark: `make bench`, or
//
//	go test ./integration-test -run '^$' -bench Load -benchtime 1x -args -load.duration=10s
//
// It starts its own redis-server, the built service (embedded store, Redis
// store) and a no-op ShouldRateLimit server on the same gRPC stack, drives
// each with the same closed-loop load and prints a table of decisions/s and
// latency percentiles as ratios to the no-op server measured in the same run.
// Loopback only; every loop is bounded by its duration.
var (
	loadDuration = flag.Duration("load.duration", 10*time.Second, "measured time per target and scenario")
	loadRounds   = flag.Int("load.rounds", 5, "slices the measured time is cut into, the targets taking turns")
	loadWarmup   = flag.Duration("load.warmup", 2*time.Second, "unmeasured warm-up per target and scenario")
	loadCallers  = flag.Int("load.callers", 50, "concurrent callers (closed loop)")
	loadConns    = flag.Int("load.conns", 4, "gRPC connections the callers share")
	loadKeys     = flag.Int("load.keys", 10000, "distinct descriptor values (OK-heavy loads)")
	loadRate     = flag.Int("load.rate", 5000, "requests/s of the fixed-rate scenario")
	loadOnly     = flag.String("load.only", "", "run only targets whose name matches this regular expression (a plain word: names that contain it)")
	loadScenario = flag.String("load.scenario", "", "run only scenarios whose name matches this regular expression")
	loadPprof    = flag.String("load.pprof", "", "save a CPU profile of the service per scenario (and, where a benchmark says so, its heap) into this directory")
	loadInFlight = flag.String("load.inflight", "", "comma-separated REDIS_PIPELINE_MAX_IN_FLIGHT values to add as Redis targets, for tuning")
	loadObserve  = flag.Bool("load.observability", false, "add memory targets with the dynamic metadata (and its rules) on, and with the /limited sketch off")
	loadPin      = flag.Bool("load.pin", true, "with two CPUs or more, pin each service and the load generator to CPU 0 and each Redis alone to CPU 1 (taskset), as a dedicated Redis host runs; off, or on one CPU, nothing is pinned")
	loadBaseline = flag.String("load.baseline", "", "server binaries of other builds, comma-separated, to add as Redis targets (\"baseline redis\", \"baseline 2 redis\", ...), to compare builds in one run")
)

const benchConfig = `
domain: bench
descriptors:
  - key: k1
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: k2
    rate_limit: {unit: hour, requests_per_unit: 1000000000, algorithm: sliding_window}
  - key: k3
    rate_limit: {unit: hour, requests_per_unit: 1000000000, algorithm: token_bucket}
  - key: over
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: per_second
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: per_minute
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
`

type loadTarget struct {
	name      string
	addr      string
	debugAddr string              // empty for the no-op server
	pid       int                 // the target's process, for its CPU time
	redis     []*redistest.Server // its Redis nodes (none for the memory store)
}

type loadSpec struct {
	name  string
	descs int    // descriptors per request
	over  bool   // OVER_LIMIT-heavy: a few keys, all over their limit after one hit
	rate  int    // fixed request rate; 0 is closed loop
	key   string // when set, every descriptor's key (else k1, k2, ...)
}

type loadResult struct {
	n                   int
	errors              int
	perSec              float64
	p50, p99, p999      time.Duration
	redisCmdsPerRequest float64
	commandsPerRequest  float64 // every command (redisCommands)
	overLimit           int
	// CPU time per request, in µs: the target process, Redis, and the load
	// generator (this process). On a shared box these are steadier than
	// req/s and show where each request's cost goes.
	cpuTarget, cpuRedis, cpuLoad float64
	scriptPerRequest             float64 // µs Redis spent in scripts, per request
}

var noopOnce sync.Once
var noopBin string

func startNoop(b *testing.B) (string, int) {
	b.Helper()
	noopOnce.Do(func() {
		noopBin = filepath.Join(filepath.Dir(serverBin), "noopserver")
		// Built as the server is (TestMain): the ratio measures the
		// service's own work, not the compiler's.
		args := []string{"build", "-trimpath", "-o", noopBin}
		if out, err := exec.Command("go", append(args, "./noopserver")...).CombinedOutput(); err != nil {
			b.Fatalf("build noopserver: %v\n%s", err, out)
		}
	})
	cmd := exec.Command(noopBin)
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		b.Fatal(err)
	}
	return strings.TrimSpace(addr), cmd.Process.Pid
}

func benchTargets(b *testing.B) []loadTarget {
	b.Helper()
	noopAddr, noopPid := startNoop(b)
	if pinned() {
		redistest.Pin(b, noopPid, "0")
	}
	ts := []loadTarget{{name: "no-op", addr: noopAddr, pid: noopPid}}
	env := map[string]string{"LOG_LEVEL": "warn"}
	cfg := writeConfig(b, map[string]string{"bench.yaml": benchConfig})
	for k, v := range cfg {
		env[k] = v
	}
	// target starts the service with env plus extra, on its own Redis when
	// withRedis is set.
	target := func(name string, withRedis bool, extra map[string]string) {
		var srvs []*redistest.Server
		if withRedis {
			srv := redistest.Start(b)
			srvs = append(srvs, srv)
			extra = merge(extra, map[string]string{"REDIS_URL": srv.Addr, "REDIS_POOL_SIZE": "20"})
		}
		ts = append(ts, startTarget(b, name, merge(env, extra), srvs))
	}
	target("memory", false, map[string]string{"BACKEND_TYPE": "memory"})
	if *loadObserve {
		target("memory+metadata", false, map[string]string{"BACKEND_TYPE": "memory", "RESPONSE_DYNAMIC_METADATA": "true",
			"RESPONSE_DYNAMIC_METADATA_RULES": "true"})
		target("memory, no sketch", false, map[string]string{"BACKEND_TYPE": "memory", "TOP_LIMITED_SIZE": "0"})
	}
	target("redis", true, nil)
	target("redis unbatched", true, map[string]string{"REDIS_PIPELINE_WINDOW": "0"})
	target("redis+local cache", true, map[string]string{"LOCAL_CACHE_SIZE_IN_BYTES": "1048576"})
	for i, bin := range strings.Split(*loadBaseline, ",") {
		if bin = strings.TrimSpace(bin); bin != "" {
			name := "baseline redis"
			if i > 0 {
				name = fmt.Sprintf("baseline %d redis", i+1)
			}
			target(name, true, map[string]string{binaryKey: bin})
		}
	}
	for _, n := range strings.Split(*loadInFlight, ",") {
		if n = strings.TrimSpace(n); n != "" {
			target("redis in-flight "+n, true, map[string]string{"REDIS_PIPELINE_MAX_IN_FLIGHT": n})
		}
	}
	return ts
}

// mustCompile compiles a filter flag's regular expression; empty matches
// everything.
func mustCompile(b testing.TB, expr string) *regexp.Regexp {
	b.Helper()
	re, err := regexp.Compile(expr)
	if err != nil {
		b.Fatalf("filter %q: %v", expr, err)
	}
	return re
}

// startTarget starts the service with env, on the Redis nodes srvs (none:
// the memory store), pinned as the benchmarks pin.
func startTarget(b *testing.B, name string, env map[string]string, srvs []*redistest.Server) loadTarget {
	b.Helper()
	p := start(b, env)
	if pinned() {
		redistest.Pin(b, p.cmd.Process.Pid, "0")
		for _, srv := range srvs {
			redistest.Pin(b, srv.Pid(), "1")
		}
	}
	return loadTarget{name: name, addr: p.grpcAddr, debugAddr: p.debugAddr, pid: p.cmd.Process.Pid, redis: srvs}
}

// pinned reports whether the load benchmark pins its processes
// (-load.pin, on a machine of two CPUs or more, with taskset installed).
// Without taskset (util-linux) the benchmark runs unpinned and says so.
func pinned() bool {
	return *loadPin && redistest.CanPin()
}

func merge(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// requests pre-builds the request mix so the generator allocates nothing per call.
func requests(spec loadSpec) []*rlsv3.RateLimitRequest {
	keys := *loadKeys
	if spec.over {
		keys = 100
	}
	out := make([]*rlsv3.RateLimitRequest, 4096)
	for i := range out {
		r := &rlsv3.RateLimitRequest{Domain: "bench"}
		for d := 1; d <= spec.descs; d++ {
			key := fmt.Sprintf("k%d", d)
			switch {
			case spec.over:
				key = "over"
			case spec.key != "":
				key = spec.key
			}
			r.Descriptors = append(r.Descriptors, &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{
				{Key: key, Value: fmt.Sprintf("v%d", rand.IntN(keys))}}})
		}
		out[i] = r
	}
	return out
}

var cpuRE = regexp.MustCompile(`used_cpu_(?:sys|user):([0-9.]+)`)

// processCPU is the CPU time pid has used so far (utime + stime from
// /proc, all threads); 0 where /proc is not there.
func processCPU(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	var utime, stime int64
	fmt.Sscan(f[11], &utime)
	fmt.Sscan(f[12], &stime)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ is 100 on Linux
}

// redisCPU is the CPU time the redis-servers srvs have used so far (INFO
// cpu), all together; nil ones count nothing.
func redisCPU(b testing.TB, srvs ...*redistest.Server) time.Duration {
	var total float64
	for _, srv := range srvs {
		if srv == nil {
			continue
		}
		info, err := srv.Do("INFO", "cpu")
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range cpuRE.FindAllStringSubmatch(info, -1) {
			var v float64
			fmt.Sscan(m[1], &v)
			total += v
		}
	}
	return time.Duration(total * float64(time.Second))
}

// redisCalls counts the scripts the redis-servers srvs have run (each
// decision's round trip) and the time they spent running them.
func redisCalls(b testing.TB, srvs ...*redistest.Server) (n int, busy time.Duration) {
	for _, srv := range srvs {
		if srv == nil {
			continue
		}
		st, err := srv.CommandStats()
		if err != nil {
			b.Fatal(err)
		}
		c, d := redistest.ScriptCalls(st)
		n, busy = n+c, busy+d
	}
	return n, busy
}

// redisCommands counts the commands the redis-servers srvs have run, the
// INFO calls that read them aside: for a service that sends no scripts
// (envoyproxy/ratelimit), its round trips' work.
func redisCommands(b testing.TB, srvs ...*redistest.Server) int {
	n := 0
	for _, srv := range srvs {
		st, err := srv.CommandStats()
		if err != nil {
			b.Fatal(err)
		}
		for name, c := range st {
			if name != "info" {
				n += c.Calls
			}
		}
	}
	return n
}

// sample is what one or more measured slices of load on one target saw.
type sample struct {
	lat                          []time.Duration
	elapsed                      time.Duration
	errors, over, calls          int
	commands                     int // every command but INFO (redisCommands)
	cpuTarget, cpuRedis, cpuLoad time.Duration
	script                       time.Duration
}

func (s *sample) add(o sample) {
	s.lat = append(s.lat, o.lat...)
	s.elapsed += o.elapsed
	s.errors += o.errors
	s.over += o.over
	s.calls += o.calls
	s.commands += o.commands
	s.cpuTarget += o.cpuTarget
	s.cpuRedis += o.cpuRedis
	s.cpuLoad += o.cpuLoad
	s.script += o.script
}

func (s *sample) result() loadResult {
	all := s.lat
	res := loadResult{errors: s.errors, overLimit: s.over}
	if len(all) == 0 {
		return res
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	res.n = len(all)
	res.perSec = float64(len(all)) / s.elapsed.Seconds()
	res.p50, res.p99, res.p999 = all[len(all)/2], all[len(all)*99/100], all[len(all)*999/1000]
	perReq := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(len(all)) }
	res.cpuTarget, res.cpuRedis, res.cpuLoad = perReq(s.cpuTarget), perReq(s.cpuRedis), perReq(s.cpuLoad)
	res.redisCmdsPerRequest = float64(s.calls) / float64(len(all))
	res.commandsPerRequest = float64(s.commands) / float64(len(all))
	res.scriptPerRequest = perReq(s.script)
	return res
}

// turnRange formats the lowest and highest per-turn ratio of f between a
// target's turns and the no-op server's turns alongside them, as " (lo-hi)";
// empty with a single turn. The pooled ratio hides how much the shared
// machine moved a figure; the spread shows it.
func turnRange(target, noop []loadResult, f func(loadResult) float64) string {
	if len(target) < 2 || len(target) != len(noop) {
		return ""
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for t := range target {
		if f(noop[t]) == 0 {
			return ""
		}
		r := f(target[t]) / f(noop[t])
		lo, hi = min(lo, r), max(hi, r)
	}
	return fmt.Sprintf(" (%.2f-%.2f)", lo, hi)
}

// loadSession drives one target through its own gRPC connections.
type loadSession struct {
	tg    loadTarget
	spec  loadSpec
	conns []*grpc.ClientConn
	reqs  []*rlsv3.RateLimitRequest
}

func newLoadSession(b testing.TB, tg loadTarget, spec loadSpec) *loadSession {
	b.Helper()
	ls := &loadSession{tg: tg, spec: spec, reqs: requests(spec)}
	for range *loadConns {
		c, err := grpc.NewClient(tg.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		ls.conns = append(ls.conns, c)
	}
	return ls
}

// run drives the target for d (recording only when record is set).
func (ls *loadSession) run(b testing.TB, d time.Duration, record bool) sample {
	tg, spec := ls.tg, ls.spec
	deadline := time.Now().Add(d)
	lat := make([][]time.Duration, *loadCallers)
	errs := make([]int, *loadCallers)
	over := make([]int, *loadCallers)
	var wg sync.WaitGroup
	startCalls, startScript := redisCalls(b, tg.redis...)
	startCommands := redisCommands(b, tg.redis...)
	startTarget, startRedis, startLoad := processCPU(tg.pid), redisCPU(b, tg.redis...), processCPU(os.Getpid())
	begin := time.Now()
	for c := range *loadCallers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := rlsv3.NewRateLimitServiceClient(ls.conns[c%len(ls.conns)])
			var tick *time.Ticker
			if spec.rate > 0 {
				// Each caller sends every period, the callers spread evenly
				// over it: arrivals at the fixed rate, not bursts of every
				// caller at once.
				period := time.Duration(float64(time.Second) * float64(*loadCallers) / float64(spec.rate))
				time.Sleep(period * time.Duration(c) / time.Duration(*loadCallers))
				tick = time.NewTicker(period)
				defer tick.Stop()
			}
			for i := c; time.Now().Before(deadline); i++ {
				if tick != nil {
					<-tick.C
				}
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := client.ShouldRateLimit(ctx, ls.reqs[i%len(ls.reqs)])
				cancel()
				if !record {
					continue
				}
				lat[c] = append(lat[c], time.Since(start))
				if err != nil {
					errs[c]++
				} else if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
					over[c]++
				}
			}
		}()
	}
	wg.Wait()
	out := sample{elapsed: time.Since(begin)}
	endCalls, endScript := redisCalls(b, tg.redis...)
	out.calls, out.script = endCalls-startCalls, endScript-startScript
	out.commands = redisCommands(b, tg.redis...) - startCommands
	out.cpuTarget = processCPU(tg.pid) - startTarget
	out.cpuRedis = redisCPU(b, tg.redis...) - startRedis
	out.cpuLoad = processCPU(os.Getpid()) - startLoad
	for c := range lat {
		out.lat = append(out.lat, lat[c]...)
		out.errors += errs[c]
		out.over += over[c]
	}
	return out
}

// profile saves a CPU profile of the target over the next d, when asked to.
func (ls *loadSession) profile(b *testing.B, d time.Duration) (wait func()) {
	return saveProfile(b, ls.tg.debugAddr, ls.tg.name+"-"+ls.spec.name, d)
}

// saveProfile saves a CPU profile of the service at debugAddr over the
// next d into the -load.pprof directory, named after name, when asked to.
func saveProfile(b *testing.B, debugAddr, name string, d time.Duration) (wait func()) {
	if *loadPprof == "" || debugAddr == "" {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		name := filepath.Join(*loadPprof, strings.NewReplacer(" ", "_", ",", "", "/", "_", "+", "_").Replace(name)+".prof")
		secs := max(1, int(d/time.Second)-1)
		resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", debugAddr, secs))
		if err != nil {
			b.Log(err)
			return
		}
		_ = os.WriteFile(name, []byte(readBody(resp)), 0o644)
	}()
	return func() { <-done }
}

// saveHeap saves the service's heap profile at debugAddr into the
// -load.pprof directory, named after name, when asked to: what is live at
// this moment, where the CPU profile says what was busy.
func saveHeap(b *testing.B, debugAddr, name string) {
	if *loadPprof == "" || debugAddr == "" {
		return
	}
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/heap?gc=1", debugAddr))
	if err != nil {
		b.Log(err)
		return
	}
	name = filepath.Join(*loadPprof, strings.NewReplacer(" ", "_", ",", "", "/", "_", "+", "_").Replace(name)+".heap")
	_ = os.WriteFile(name, []byte(readBody(resp)), 0o644)
}

// pinGenerator pins this process (the load generator) to CPU 0 when the
// benchmarks pin (pinned), until the benchmark ends, and says which
// placement the benchmark runs in.
func pinGenerator(b *testing.B) string {
	placement := fmt.Sprintf("unpinned, %d CPUs shared", runtime.NumCPU())
	if *loadPin && runtime.NumCPU() >= 2 && !pinned() {
		placement += " (taskset not found)"
	}
	if pinned() {
		// The generator with the services, Redis alone: what one Redis
		// core gives is then measured as a dedicated Redis host gives it.
		redistest.PinSelf(b)
		placement = "pinned: services and load generator on CPU 0, each Redis alone on CPU 1"
	}
	return placement
}

func BenchmarkLoad(b *testing.B) {
	placement := pinGenerator(b)
	for range b.N {
		targets := benchTargets(b)
		specs := []loadSpec{
			{name: "1 descriptor, OK-heavy", descs: 1},
			{name: "3 descriptors, OK-heavy", descs: 3},
			{name: "1 descriptor, OVER_LIMIT-heavy", descs: 1, over: true},
			{name: fmt.Sprintf("1 descriptor, fixed %d req/s", *loadRate), descs: 1, rate: *loadRate},
			// A fixed window of each length: a per-second window's count
			// is nearly always its key's first (10,000 values).
			{name: "1 descriptor, per-second windows, OK-heavy", descs: 1, key: "per_second"},
			{name: "1 descriptor, per-minute windows, OK-heavy", descs: 1, key: "per_minute"},
			{name: fmt.Sprintf("1 descriptor, per-second windows, fixed %d req/s", *loadRate), descs: 1, rate: *loadRate, key: "per_second"},
		}
		var rows []string
		rows = append(rows, fmt.Sprintf("load: %d callers (closed loop) over %d connections, %v per target and scenario in %d turns, after %v warm-up; %s",
			*loadCallers, *loadConns, *loadDuration, *loadRounds, *loadWarmup, placement))
		rows = append(rows, "| load | target | req/s | ratio (by turn) | p50 | p99 | p99.9 | p99 ratio (by turn) | over-limit | errors | redis cmds/req | CPU µs/req service / redis (script) / load | redis µs/decision (script) |",
			"|---|---|---|---|---|---|---|---|---|---|---|---|---|")
		onlyTargets, onlyScenarios := mustCompile(b, *loadOnly), mustCompile(b, *loadScenario)
		for _, spec := range specs {
			if !onlyScenarios.MatchString(spec.name) {
				continue
			}
			// The targets take turns, slice by slice, so that a slow spell of
			// the shared machine hits all of them alike.
			var sessions []*loadSession
			for _, tg := range targets {
				if tg.name != "no-op" && !onlyTargets.MatchString(tg.name) {
					continue
				}
				if tg.name == "redis+local cache" && !spec.over {
					continue
				}
				sessions = append(sessions, newLoadSession(b, tg, spec))
			}
			samples := make([]sample, len(sessions))
			rounds := max(1, *loadRounds)
			turns := make([][]loadResult, len(sessions)) // per session, per turn
			slice := *loadDuration / time.Duration(rounds)
			for round := range rounds {
				for i, ls := range sessions {
					warm := 300 * time.Millisecond // connections and caches are warm already
					if round == 0 {
						warm = *loadWarmup
					}
					ls.run(b, warm, false)
					wait := func() {}
					if round == 0 {
						wait = ls.profile(b, slice)
					}
					got := ls.run(b, slice, true)
					turns[i] = append(turns[i], got.result())
					samples[i].add(got)
					wait()
				}
			}
			base := samples[0].result() // the no-op server
			for i, ls := range sessions {
				r := samples[i].result()
				rate := func(x loadResult) float64 { return x.perSec }
				tail := func(x loadResult) float64 { return float64(x.p99) }
				spread := func(f func(loadResult) float64) string {
					if i == 0 {
						return "" // the no-op server against itself
					}
					return turnRange(turns[i], turns[0], f)
				}
				rows = append(rows, fmt.Sprintf("| %s | %s | %.0f | %.2f%s | %v | %v | %v | %.2f%s | %.0f%% | %d | %.2f | %.1f / %.1f (%.1f) / %.1f | %.2f (%.2f) |",
					spec.name, ls.tg.name, r.perSec, r.perSec/base.perSec, spread(rate), r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond),
					r.p999.Round(time.Microsecond), float64(r.p99)/float64(base.p99), spread(tail), 100*float64(r.overLimit)/float64(max(r.n, 1)), r.errors, r.redisCmdsPerRequest,
					r.cpuTarget, r.cpuRedis, r.scriptPerRequest, r.cpuLoad, r.cpuRedis/float64(spec.descs), r.scriptPerRequest/float64(spec.descs)))
				b.Log(rows[len(rows)-1])
			}
		}
		fmt.Fprintln(os.Stdout, strings.Join(rows, "\n"))
	}
}
