package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/limiter/limitertest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

var _ limiter.Store = (*Store)(nil)

// testTimeout bounds the test clients' Redis calls: far beyond what a
// loaded 2-core machine needs, since a test that fails for want of CPU
// proves nothing (tests of timeouts set their own).
const testTimeout = 30 * time.Second

func single(t testing.TB, srv *redistest.Server) goredis.UniversalClient {
	t.Helper()
	c, err := NewClient(ClientOptions{URL: srv.Addr, Type: "single", PoolSize: 16, Timeout: testTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// startCluster starts a 3-master Cluster and a client of it.
func startCluster(t *testing.T) ([]*redistest.Server, goredis.UniversalClient) {
	t.Helper()
	nodes := redistest.StartCluster(t, 3)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.Addr)
	}
	c, err := NewClient(ClientOptions{URL: strings.Join(addrs, ","), Type: "cluster", PoolSize: 16, Timeout: testTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return nodes, c
}

func newStore(t testing.TB, c goredis.UniversalClient, opts Options) *Store {
	t.Helper()
	s, err := New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Preload(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestConformanceSingle(t *testing.T) {
	s := newStore(t, single(t, redistest.Start(t)), Options{})
	limitertest.Run(t, func(*testing.T) limiter.Store { return s })
}

// The same suite through the pipeline batcher.
func TestConformanceSingleBatched(t *testing.T) {
	s := newStore(t, single(t, redistest.Start(t)), Options{Batch: true, BatchLimit: 16})
	limitertest.Run(t, func(*testing.T) limiter.Store { return s })
}

func TestConformanceCluster(t *testing.T) {
	nodes, c := startCluster(t)
	s := newStore(t, c, Options{})
	limitertest.Run(t, func(*testing.T) limiter.Store { return s })
	batched := newStore(t, c, Options{Batch: true})
	t.Run("batched", func(t *testing.T) {
		limitertest.Run(t, func(*testing.T) limiter.Store { return batched })
	})
	t.Run("keys spread over the masters", func(t *testing.T) {
		for i := range 30 {
			r := limiter.Rule{Limit: 5, Period: time.Minute}
			if _, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: fmt.Sprintf("{spread%d}:fw60", i), Rule: r, Cost: 1}}}); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range nodes {
			if got, _ := n.Do("DBSIZE"); got == "0" {
				t.Errorf("master %s holds no key after 30 distinct descriptors", n.Addr)
			}
		}
	})
}

func TestConformanceSentinel(t *testing.T) {
	st := redistest.StartSentinel(t)
	c, err := NewClient(ClientOptions{URL: st.MasterName + "," + strings.Join(st.SentinelAddrs(), ","), Type: "sentinel", PoolSize: 16, Timeout: testTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c, Options{})
	limitertest.Run(t, func(*testing.T) limiter.Store { return s })
	batched := newStore(t, c, Options{Batch: true})
	t.Run("batched", func(t *testing.T) {
		limitertest.Run(t, func(*testing.T) limiter.Store { return batched })
	})
}

// commandStats reads a node's INFO commandstats, by lower-case command.
func commandStats(t testing.TB, n *redistest.Server) map[string]redistest.CommandStat {
	t.Helper()
	st, err := n.CommandStats()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// commandCalls returns Redis's per-command call counts.
func commandCalls(t testing.TB, srv *redistest.Server) map[string]int {
	t.Helper()
	out := map[string]int{}
	for name, st := range commandStats(t, srv) {
		out[name] = st.Calls
	}
	return out
}

// scriptCalls counts the calls of batch.lua Redis has run: as a function
// (FCALL) or as a script (EVALSHA, EVAL).
func scriptCalls(t testing.TB, srv *redistest.Server) int {
	t.Helper()
	calls, _ := redistest.ScriptCalls(commandStats(t, srv))
	return calls
}

func hits(prefix string, n int, r limiter.Rule) []limiter.Hit {
	out := make([]limiter.Hit, n)
	for i := range out {
		out[i] = limiter.Hit{Key: fmt.Sprintf("{%s%d}:x", prefix, i), Rule: r, Cost: 1}
	}
	return out
}

func TestFiveDescriptorsOneRoundTrip(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, single(t, srv), Options{})
	r := limiter.Rule{Limit: 10, Period: time.Minute}
	// Warm the connection so that its handshake is not counted.
	if _, err := s.Apply(context.Background(), limiter.Batch{Hits: hits("warm", 1, r)}); err != nil {
		t.Fatal(err)
	}
	before := commandCalls(t, srv)
	if _, err := s.Apply(context.Background(), limiter.Batch{Hits: hits("rt", 5, r)}); err != nil {
		t.Fatal(err)
	}
	after := commandCalls(t, srv)
	total := 0
	for cmd, n := range after {
		switch cmd {
		case "info", "get", "set", "time", "incrby", "decrby", "pexpire": // ours, or run inside the script
		default:
			total += n - before[cmd]
		}
	}
	if calls := after["fcall"] + after["evalsha"] + after["eval"] - before["fcall"] - before["evalsha"] - before["eval"]; total != 1 || calls != 1 {
		t.Logf("before %v\nafter %v", before, after)
		t.Errorf("5 descriptors cost %d commands (%d calls of the script), want exactly one call", total, calls)
	}
}

// TestFlushedCodeIsRecovered: with the function library and the script
// both gone (a restart without persistence, FUNCTION FLUSH and SCRIPT
// FLUSH), a call runs as the script, loaded again, counted once; once a
// load is due, the library is back and calls are FCALLs again.
func TestFlushedCodeIsRecovered(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, single(t, srv), Options{})
	r := limiter.Rule{Limit: 4, Period: time.Hour}
	h := []limiter.Hit{{Key: "{flush}:fw", Rule: r, Cost: 1}}
	for i, want := range []uint64{3, 2, 1} {
		switch i {
		case 1:
			for _, cmd := range [][]string{{"SCRIPT", "FLUSH"}, {"FUNCTION", "FLUSH"}} {
				if _, err := srv.Do(cmd...); err != nil {
					t.Fatal(err)
				}
			}
		case 2:
			s.runner.loadMu.Lock()
			s.runner.lastLoad = time.Time{} // due now, not in a second
			s.runner.loadMu.Unlock()
		}
		before := commandCalls(t, srv)
		out, err := s.Apply(context.Background(), limiter.Batch{Now: limitertest.T0, Hits: h})
		if err != nil {
			t.Fatalf("call %d: Apply after the flush: %v", i, err)
		}
		if out[0].Remaining != want {
			t.Errorf("call %d: Remaining = %d, want %d (counted exactly once)", i, out[0].Remaining, want)
		}
		after := commandCalls(t, srv)
		fcalls, scripts := after["fcall"]-before["fcall"], after["eval"]+after["evalsha"]-before["eval"]-before["evalsha"]
		// Right after the flush the FCALL fails (not found) and the script
		// runs; otherwise the function alone.
		if i == 1 && after["eval"] == before["eval"] || i != 1 && (fcalls != 1 || scripts != 0) {
			t.Errorf("call %d: %d FCALL, %d EVAL or EVALSHA: want the function, but the script (EVAL) right after the flush", i, fcalls, scripts)
		}
	}
}

// TestFunctionsRefusedByACL: a Redis user that may not load functions
// still gets every decision, from the script, and the refusal is reported.
func TestFunctionsRefusedByACL(t *testing.T) {
	srv := redistest.Start(t)
	if _, err := srv.Do("ACL", "SETUSER", "limited", "on", ">secret", "~*", "+@all", "-function"); err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ClientOptions{URL: srv.Addr, Type: "single", PoolSize: 4, Timeout: testTimeout, Auth: "limited:secret"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c, Options{})
	if err := s.FunctionsRefused(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("FunctionsRefused() = %v, want the NOPERM answer to FUNCTION LOAD", err)
	}
	r := limiter.Rule{Limit: 2, Period: time.Hour}
	h := []limiter.Hit{{Key: "{acl}:fw", Rule: r, Cost: 1}}
	for i, want := range []bool{true, true, false} {
		out, err := s.Apply(context.Background(), limiter.Batch{Hits: h})
		if err != nil || out[0].Allowed != want {
			t.Fatalf("call %d: %+v, %v; want allowed = %v", i, out, err, want)
		}
	}
	if st := commandCalls(t, srv); st["fcall"] != 0 || st["evalsha"] == 0 {
		t.Errorf("FCALL %d, EVALSHA %d: want the script only", st["fcall"], st["evalsha"])
	}
}

func TestEveryKeyHasTTL(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, single(t, srv), Options{Prefix: "ttl_"})
	for _, a := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindow, limiter.TokenBucket, limiter.SlidingLog, limiter.Concurrency} {
		r := limiter.Rule{Algorithm: a, Limit: 5, Period: time.Hour}
		if _, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: "{ttl" + a.String() + "}:k", Rule: r, Cost: 1}}}); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := srv.Do("KEYS", "ttl_"+keyVersion+"*")
	if err != nil {
		t.Fatal(err)
	}
	list := strings.Fields(keys)
	if len(list) != 5 {
		t.Fatalf("keys = %q, want 5 keys with the prefix and version", keys)
	}
	for _, k := range list {
		pttl, _ := srv.Do("PTTL", k)
		if n, _ := strconv.Atoi(pttl); n <= 0 || n > int(2*time.Hour/time.Millisecond) {
			t.Errorf("PTTL %s = %s, want a positive TTL of at most two windows", k, pttl)
		}
	}
}

// Two replicas whose own clocks disagree by an hour still count in one window:
// without an explicit Now, the script reads Redis's clock.
func TestSkewedReplicasShareRedisClock(t *testing.T) {
	srv := redistest.Start(t)
	c := single(t, srv)
	a := newStore(t, c, Options{Clock: func() time.Time { return time.Now().Add(-time.Hour) }})
	b := newStore(t, c, Options{Clock: func() time.Time { return time.Now().Add(time.Hour) }})
	r := limiter.Rule{Limit: 2, Period: time.Hour}
	h := []limiter.Hit{{Key: "{skew}:fw", Rule: r, Cost: 1}}
	var allowed int
	for _, s := range []*Store{a, b, a, b} {
		out, err := s.Apply(context.Background(), limiter.Batch{Hits: h})
		if err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed {
			allowed++
		}
	}
	if allowed != 2 {
		t.Errorf("two skewed replicas allowed %d of 4 on a limit of 2, want 2", allowed)
	}
}

func TestLocalCacheSparesRedis(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, single(t, srv), Options{LocalCacheBytes: 1 << 20})
	r := limiter.Rule{Limit: 1, Period: time.Hour}
	h := []limiter.Hit{{Key: "{cache}:fw", Rule: r, Cost: 1}}
	now := limitertest.T0
	for range 2 {
		if _, err := s.Apply(context.Background(), limiter.Batch{Now: now, Hits: h}); err != nil {
			t.Fatal(err)
		}
	}
	before := scriptCalls(t, srv)
	for i := range 50 {
		out, err := s.Apply(context.Background(), limiter.Batch{Now: now.Add(time.Duration(i) * time.Second), Hits: h})
		if err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed || out[0].RetryAfter != time.Hour-time.Duration(i)*time.Second {
			t.Fatalf("cached answer %d = %+v, want rejected with RetryAfter counting down", i, out[0])
		}
	}
	if got := scriptCalls(t, srv) - before; got != 0 {
		t.Errorf("50 rejections of a known over-limit key made %d Redis calls, want 0", got)
	}
	// A raised limit is a different rule: the cache must not answer for it.
	h[0].Rule.Limit = 5
	out, err := s.Apply(context.Background(), limiter.Batch{Now: now, Hits: h})
	if err != nil || !out[0].Allowed {
		t.Errorf("after raising the limit: %+v, %v; want allowed from Redis", out, err)
	}
	// Past the window the cache no longer answers.
	h[0].Rule.Limit = 1
	out, err = s.Apply(context.Background(), limiter.Batch{Now: now.Add(time.Hour), Hits: h})
	if err != nil || !out[0].Allowed {
		t.Errorf("next window: %+v, %v; want allowed", out, err)
	}
}

// TestLocalCacheAndUsageReports: the local over-limit cache never answers
// an overdraft hit (it must be counted in Redis) and forgets a key that a
// refund gave budget back to.
func TestLocalCacheAndUsageReports(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, single(t, srv), Options{LocalCacheBytes: 1 << 20})
	now := limitertest.T0
	apply := func(h limiter.Hit) limiter.Outcome {
		t.Helper()
		out, err := s.Apply(context.Background(), limiter.Batch{Now: now, Hits: []limiter.Hit{h}})
		if err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	plain := limiter.Rule{Limit: 2, Period: time.Hour}
	apply(limiter.Hit{Key: "{rf}:fw", Rule: plain, Cost: 2})
	if apply(limiter.Hit{Key: "{rf}:fw", Rule: plain, Cost: 1}).Allowed {
		t.Fatal("third hit on a limit of 2 allowed")
	}
	if out := apply(limiter.Hit{Key: "{rf}:fw", Rule: plain, Cost: 1, Refund: true}); !out.Allowed || out.Remaining != 1 {
		t.Errorf("refund of 1: %+v, want allowed with 1 left", out)
	}
	if out := apply(limiter.Hit{Key: "{rf}:fw", Rule: plain, Cost: 1}); !out.Allowed {
		t.Errorf("after the refund: %+v, want allowed (the cached rejection forgotten)", out)
	}

	od := limiter.Rule{Limit: 2, Period: time.Hour, Overdraft: true}
	for range 3 {
		apply(limiter.Hit{Key: "{od}:fw", Rule: od, Cost: 2})
	}
	// 6 counted although only 2 fit; a refund of 3 leaves 3 used: still over.
	if out := apply(limiter.Hit{Key: "{od}:fw", Rule: od, Cost: 3, Refund: true}); out.Remaining != 0 {
		t.Errorf("refund of 3 after 6 used of 2: %+v, want 0 left", out)
	}
	if out := apply(limiter.Hit{Key: "{od}:fw", Rule: od, Cost: 2, Refund: true}); !out.Allowed || out.Remaining != 1 {
		t.Errorf("refund of 2 more: %+v, want 1 left (every overdraft hit was counted in Redis)", out)
	}
}

func TestRedisDownThenBack(t *testing.T) {
	srv := redistest.Start(t)
	c, err := NewClient(ClientOptions{URL: srv.Addr, Type: "single", PoolSize: 4, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := newStore(t, c, Options{})
	h := []limiter.Hit{{Key: "{down}:fw", Rule: limiter.Rule{Limit: 5, Period: time.Hour}, Cost: 1}}
	if _, err := s.Apply(context.Background(), limiter.Batch{Hits: h}); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	start := time.Now()
	if _, err := s.Apply(context.Background(), limiter.Batch{Hits: h}); err == nil {
		t.Fatal("Apply with Redis stopped: nil error")
	}
	t.Logf("error returned %v after Redis stopped (timeout 300ms)", time.Since(start))
	if s.Ping(context.Background()) == nil {
		t.Error("Ping with Redis stopped: nil error")
	}
	srv.Restart()
	// The restarted server is empty and has no script: the store recovers
	// by itself (reconnect, NOSCRIPT fallback). A stale pooled connection
	// may fail one call first; a failed call counts nothing.
	var out []limiter.Outcome
	for attempt := 0; ; attempt++ {
		if out, err = s.Apply(context.Background(), limiter.Batch{Hits: h}); err == nil {
			break
		}
		if attempt == 50 {
			t.Fatalf("Apply after restart still failing: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // polling recovery, not correctness
	}
	if !out[0].Allowed || out[0].Remaining != 4 {
		t.Errorf("Apply after restart = %+v; want allowed with 4 left", out)
	}
}

// Two stores (two service replicas) hammer one key: exactly the limit passes.
func TestTwoReplicasShareOneLimit(t *testing.T) {
	srv := redistest.Start(t)
	replicas := []*Store{newStore(t, single(t, srv), Options{}), newStore(t, single(t, srv), Options{})}
	const limit = 50
	r := limiter.Rule{Limit: limit, Period: time.Hour}
	var mu sync.Mutex
	allowed := 0
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := replicas[w%2]
			for range 10 {
				out, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: "{shared}:fw", Rule: r, Cost: 1}}})
				if err != nil {
					t.Error(err)
					return
				}
				if out[0].Allowed {
					mu.Lock()
					allowed++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if allowed != limit {
		t.Errorf("two replicas, 160 hits on a limit of %d: allowed %d", limit, allowed)
	}
}

func TestClusterAllOrNothingAcrossSlots(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{nodes[0].Addr}})
	defer c.Close()
	s := newStore(t, c, Options{})
	one := limiter.Rule{Limit: 1, Period: time.Hour}
	five := limiter.Rule{Limit: 5, Period: time.Hour}
	ctx := context.Background()
	if _, err := s.Apply(ctx, limiter.Batch{Now: limitertest.T0, Hits: []limiter.Hit{{Key: "{a}:x", Rule: one, Cost: 1}}}); err != nil {
		t.Fatal(err)
	}
	out, err := s.Apply(ctx, limiter.Batch{Now: limitertest.T0, AllOrNothing: true, Hits: []limiter.Hit{{Key: "{b}:x", Rule: five, Cost: 1}, {Key: "{a}:x", Rule: one, Cost: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if !out[0].Allowed || out[0].Remaining != 5 || out[1].Allowed {
		t.Errorf("rejected request across slots = %+v, want b allowed with 5 left (nothing counted), a rejected", out)
	}
}

// One merged script call of several decisions gives what the same decisions
// give one after the other in the reference (memory) store: a few, and a
// full batch of 128 decisions of three hits (a reply of more doubles than
// batch.lua packs at once, in mixed modes and algorithms).
func TestMergedBatchMatchesSequential(t *testing.T) {
	one := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 2, Period: time.Minute}
	tb := limiter.Rule{Algorithm: limiter.TokenBucket, Limit: 3, Period: time.Minute}
	few := []limiter.Batch{
		{Now: limitertest.T0, Hits: []limiter.Hit{{Key: "{m}:a", Rule: one, Cost: 1}, {Key: "{m}:b", Rule: tb, Cost: 2}}},
		{Now: limitertest.T0.Add(time.Second), AllOrNothing: true, Hits: []limiter.Hit{{Key: "{m}:b", Rule: tb, Cost: 1}, {Key: "{m}:a", Rule: one, Cost: 2}}},
		{Now: limitertest.T0.Add(2 * time.Second), Hits: []limiter.Hit{{Key: "{m}:a", Rule: one, Cost: 1}}},
	}
	rules := []limiter.Rule{
		{Algorithm: limiter.FixedWindow, Limit: 50, Period: time.Minute},
		{Algorithm: limiter.TokenBucket, Limit: 40, Period: time.Minute},
		{Algorithm: limiter.SlidingWindow, Limit: 30, Period: time.Minute},
		{Algorithm: limiter.FixedWindow, Limit: 45, Period: time.Minute, CountRejected: true},
	}
	var full []limiter.Batch
	for i := range 128 {
		bt := limiter.Batch{Now: limitertest.T0.Add(time.Duration(i) * time.Millisecond), AllOrNothing: i%5 == 0}
		for j := range 3 {
			r := (i + j) % len(rules) // a key holds one algorithm's state
			bt.Hits = append(bt.Hits, limiter.Hit{Key: fmt.Sprintf("{m}:%d:%d", r, (i+2*j)%5), Rule: rules[r], Cost: uint64(1 + i%2)})
		}
		full = append(full, bt)
	}
	if got := 4 * 3 * len(full); got <= 1024 {
		t.Fatalf("the full batch's reply holds %d doubles; it must pass batch.lua's PACK_CHUNK (1024)", got)
	}
	for _, tc := range []struct {
		name    string
		batches []limiter.Batch
	}{{"few", few}, {"full", full}} {
		t.Run(tc.name, func(t *testing.T) { testMergedBatch(t, tc.batches) })
	}
}

func testMergedBatch(t *testing.T, batches []limiter.Batch) {
	srv := redistest.Start(t)
	c := single(t, srv)
	if err := batchScript.Load(context.Background(), c).Err(); err != nil {
		t.Fatal(err)
	}
	mem := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
	defer mem.Close()
	var calls []*call
	for _, bt := range batches {
		hits := make([]*limiter.Hit, len(bt.Hits))
		keys := make([]string, len(bt.Hits))
		for i := range bt.Hits {
			hits[i], keys[i] = &bt.Hits[i], keyVersion+bt.Hits[i].Key
		}
		mode := modeEach
		if bt.AllOrNothing {
			mode = modeAllOrNothing
		}
		calls = append(calls, scriptCall(keys, scriptArg(bt.Now.UnixMicro(), bt.Now, mode, hits, nil, 0)))
	}
	routes := make([]route, len(calls))
	for i, cl := range calls {
		routes[i] = cl.route
	}
	roundTrip(context.Background(), c, false, mergeScripts(routes, true)) // merged: one script call
	for i, bt := range batches {
		r := calls[i]
		if err := r.failure(); err != nil {
			t.Fatalf("decision %d: %v", i, err)
		}
		got, err := parseOutcomes(r.route.(*scriptRoute).reply, len(bt.Hits), nil)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := mem.Apply(context.Background(), bt)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("decision %d in a merged call = %+v, want (memory store, in order) %+v", i, got, want)
		}
	}
}

// A key must outlive the time its state matters (until its window, or its
// bucket's theoretical arrival time, has passed), however often it is written:
// the script keeps a window key's TTL while the window stays the same and sets
// a new one when it changes. Each step's now is explicit, so the TTL the
// script computes is known; Redis's own clock only shaves a few ms off it.
func TestTTLFollowsTheWindow(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, single(t, srv), Options{})
	// An instant behind Redis's clock: TTLs are measured from it (a batch
	// counted ahead of Redis's clock is TestTTLOfABatchCountedAhead's).
	hour := time.Unix(1_700_000_000/3600*3600, 0)
	steps := []time.Duration{50 * time.Minute, 55 * time.Minute, 65 * time.Minute, 125 * time.Minute}
	for _, alg := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindow, limiter.TokenBucket} {
		for _, aon := range []bool{false, true} {
			name := fmt.Sprintf("%s/allOrNothing=%v", alg, aon)
			t.Run(name, func(t *testing.T) {
				key := "{ttlw}:" + name
				r := limiter.Rule{Algorithm: alg, Limit: 100, Period: time.Hour}
				for _, at := range steps {
					now := hour.Add(at)
					if _, err := s.Apply(context.Background(), limiter.Batch{Now: now, AllOrNothing: aon,
						Hits: []limiter.Hit{{Key: key, Rule: r, Cost: 1}}}); err != nil {
						t.Fatal(err)
					}
					// How long the state matters after now.
					var need time.Duration
					switch alg {
					case limiter.FixedWindow:
						need = now.Truncate(time.Hour).Add(time.Hour).Sub(now)
					case limiter.SlidingWindow:
						need = now.Truncate(time.Hour).Add(2 * time.Hour).Sub(now)
					case limiter.TokenBucket:
						need = r.Period / time.Duration(r.Limit) // one token's interval, GCRA's tat - now after one hit
					}
					pttl, err := srv.Do("PTTL", stateKey(keyVersion+key, r, now))
					if err != nil {
						t.Fatal(err)
					}
					got, _ := strconv.Atoi(pttl)
					ms := int(need / time.Millisecond)
					if got < ms-5000 || got > int(2*time.Hour/time.Millisecond) {
						t.Errorf("at +%v: PTTL = %d ms, want at least %d ms (and at most two windows)", at, got, ms)
					}
				}
			})
		}
	}
}

// TestTTLOfABatchCountedAhead: a batch counted at an instant ahead of
// Redis's clock (an RLQS reservation for a coming window) keeps its key
// until that window ends by Redis's clock, not for one window from now.
func TestTTLOfABatchCountedAhead(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, single(t, srv), Options{})
	// The last: a fixed window that counts rejected hits (fixed_count in
	// batch.lua).
	for i, alg := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindow, limiter.TokenBucket, limiter.SlidingLog, limiter.FixedWindow} {
		key := fmt.Sprintf("{ahead}:%s%d", alg, i)
		r := limiter.Rule{Algorithm: alg, Limit: 10, Period: time.Second, CountRejected: i == 4}
		ahead := time.Now().Add(30 * time.Second).Truncate(time.Second)
		if _, err := s.Apply(context.Background(), limiter.Batch{Now: ahead, Hits: []limiter.Hit{{Key: key, Rule: r, Cost: 3}}}); err != nil {
			t.Fatal(err)
		}
		pttl, err := srv.Do("PTTL", stateKey(keyVersion+key, r, ahead))
		if err != nil {
			t.Fatal(err)
		}
		// At least until 30 s from now, less what this test took since.
		if got, _ := strconv.Atoi(pttl); got < 25_000 {
			t.Errorf("%s: PTTL = %s ms after counting 30 s ahead, want the key to outlive that window", alg, pttl)
		}
	}
}

// TestScriptFlushMidLoadCluster: the script flushed from every node while
// decisions spread over slots are in flight (a restart, SCRIPT FLUSH, a
// failover) costs no error and no double count, batched or not: a call
// that found it gone did not run, and is run again once.
func TestScriptFlushMidLoadCluster(t *testing.T) {
	nodes, c := startCluster(t)
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
			s := newStore(t, c, Options{Batch: batched})
			r := limiter.Rule{Limit: 1_000_000, Period: time.Hour}
			keys := func(g int) []limiter.Hit { // two slots per decision
				return []limiter.Hit{{Key: fmt.Sprintf("{flush%v-a%d}:fw", batched, g), Rule: r, Cost: 1},
					{Key: fmt.Sprintf("{flush%v-b%d}:fw", batched, g), Rule: r, Cost: 1}}
			}
			const workers, per = 8, 120
			var done atomic.Int64
			var wg sync.WaitGroup
			for g := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range per {
						if _, err := s.Apply(context.Background(), limiter.Batch{Now: limitertest.T0, Hits: keys(g)}); err != nil {
							t.Error(err)
							return
						}
						if done.Add(1) == workers*per/3 {
							for _, n := range nodes {
								for _, cmd := range [][]string{{"SCRIPT", "FLUSH"}, {"FUNCTION", "FLUSH"}} {
									if _, err := n.Do(cmd...); err != nil {
										t.Error(err)
									}
								}
							}
						}
					}
				}()
			}
			wg.Wait()
			for g := range workers {
				hits := keys(g)
				for i := range hits {
					hits[i].Cost = 0
				}
				out, err := s.Apply(context.Background(), limiter.Batch{Now: limitertest.T0, Hits: hits})
				if err != nil {
					t.Fatal(err)
				}
				for i, o := range out {
					if used := r.Limit - o.Remaining; used != per {
						t.Errorf("worker %d key %d counted %d hits, want %d (each once)", g, i, used, per)
					}
				}
			}
		})
	}
}

// TestFixedWindowKeyPerWindow: a fixed window's count of each window is
// its own key (win_key in state.lua), which lives no longer than a window:
// a key hit window after window holds no more than two.
func TestFixedWindowKeyPerWindow(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, single(t, srv), Options{})
	r := limiter.Rule{Limit: 100, Period: time.Minute}
	key := "{fields}:fw60"
	for w := range 5 {
		now := limitertest.T0.Truncate(time.Minute).Add(time.Duration(w) * time.Minute)
		for range 3 {
			if _, err := s.Apply(context.Background(), limiter.Batch{Now: now, Hits: []limiter.Hit{{Key: key, Rule: r, Cost: 1}}}); err != nil {
				t.Fatal(err)
			}
		}
		wk := stateKey(keyVersion+key, r, now)
		if got, err := srv.Do("GET", wk); err != nil || got != "3" {
			t.Errorf("window %d: GET %s = %q (%v), want this window's count, 3", w, wk, got, err)
		}
		pttl, err := srv.Do("PTTL", wk)
		if err != nil {
			t.Fatal(err)
		}
		if ms, _ := strconv.Atoi(pttl); ms <= 0 || ms > 60_000 {
			t.Errorf("window %d: PTTL %s = %s ms, want at most the window", w, wk, pttl)
		}
	}
}

// stateKey is where r's state for key is at now: a fixed window's count
// under its window's own key, any other algorithm's under key.
func stateKey(key string, r limiter.Rule, now time.Time) string {
	if r.Algorithm != limiter.FixedWindow {
		return key
	}
	return windowKey(key, now.UnixMicro()/r.Period.Microseconds())
}

// TestTokenBucketTTLIsKept: a token bucket's TTL is set with room to
// spare and kept (SET ... KEEPTTL) while the bucket's theoretical arrival
// time stays within it, then set again, further out.
func TestTokenBucketTTLIsKept(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, single(t, srv), Options{})
	// 1,000 an hour: each hit moves the tat 3.6 s on; the first TTL runs
	// to twice that (7.2 s), which the second hit's tat reaches exactly.
	r := limiter.Rule{Algorithm: limiter.TokenBucket, Limit: 1000, Period: time.Hour}
	key := "{tbttl}:tb3600"
	pttl := func() int {
		v, err := srv.Do("PTTL", keyVersion+key)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(v)
		return n
	}
	var got []int
	for range 3 {
		if _, err := s.Apply(context.Background(), limiter.Batch{Now: limitertest.T0, Hits: []limiter.Hit{{Key: key, Rule: r, Cost: 1}}}); err != nil {
			t.Fatal(err)
		}
		got = append(got, pttl())
	}
	if got[0] < 7000 || got[0] > 7200 || got[1] > got[0] || got[2] < 21000 || got[2] > 21600 {
		t.Errorf("PTTL after each of three hits = %v ms, want about 7200, then kept (no more than before), then about 21600", got)
	}
}

// replyErr is an error reply of Redis, as go-redis reports one.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

func TestLastingRefusal(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{replyErr("ERR unknown command 'FUNCTION', with args beginning with: 'LOAD' "), true},
		{replyErr("NOPERM this user has no permissions to run the 'function|load' command"), true},
		{replyErr("ERR Error registering functions"), true},
		{replyErr("ERR max number of clients reached"), false},
		{replyErr("LOADING Redis is loading the dataset in memory"), false},
		{replyErr("READONLY You can't write against a read only replica."), false},
		{context.DeadlineExceeded, false},
	} {
		if got := lastingRefusal(tc.err); got != tc.want {
			t.Errorf("lastingRefusal(%q) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestLocalCacheNeverHoldsASlot: a concurrency limit's full answer is not
// remembered, since a release through another replica frees a slot at any
// moment; the replica that saw it full takes the freed slot at once.
func TestLocalCacheNeverHoldsASlot(t *testing.T) {
	srv := redistest.Start(t)
	a := newStore(t, single(t, srv), Options{LocalCacheBytes: 1 << 20})
	b := newStore(t, single(t, srv), Options{LocalCacheBytes: 1 << 20})
	r := limiter.Rule{Algorithm: limiter.Concurrency, Limit: 1, Period: time.Hour}
	take := limiter.Batch{Now: limitertest.T0, Hits: []limiter.Hit{{Key: "{slots}:cc", Rule: r, Cost: 1}}}
	release := limiter.Batch{Now: limitertest.T0, Hits: []limiter.Hit{{Key: "{slots}:cc", Rule: r, Cost: 1, Refund: true}}}
	for i, want := range []bool{true, false} {
		if out, err := a.Apply(context.Background(), take); err != nil || out[0].Allowed != want {
			t.Fatalf("take %d on a: %+v, %v; want allowed %v", i+1, out, err, want)
		}
	}
	if _, err := b.Apply(context.Background(), release); err != nil {
		t.Fatal(err)
	}
	if out, err := a.Apply(context.Background(), take); err != nil || !out[0].Allowed || out[0].Cached {
		t.Errorf("a takes the slot b gave back: %+v, %v; want allowed by Redis", out, err)
	}
}
