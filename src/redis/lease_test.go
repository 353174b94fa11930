package redis

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
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

// leaseOptions is leasing as configured by default, except that the
// background sweep never runs within a test: tests that set their own
// time (Batch.Now) sweep themselves (sweepLeases), and the sweeper's real
// clock would see their slices as idle.
func leaseOptions() Options {
	return Options{LeaseInterval: 50 * time.Millisecond, LeaseIdle: time.Hour}
}

// windowCount reads a window algorithm's current count from Redis: a
// sliding window's is the second of the three doubles under its key, a
// fixed window's the integer under its newest window's key (KEY|w).
func windowCount(t testing.TB, c goredis.UniversalClient, key string) uint64 {
	t.Helper()
	ctx := context.Background()
	typ, err := c.Type(ctx, keyVersion+key).Result()
	if err != nil {
		t.Fatalf("TYPE %s: %v", key, err)
	}
	if typ == "none" {
		_, n := newestWindow(t, c, keyVersion+key)
		return n
	}
	b, err := c.Get(ctx, keyVersion+key).Bytes()
	if err != nil || len(b) != 24 {
		t.Fatalf("GET %s: %d bytes, %v", key, len(b), err)
	}
	return uint64(math.Float64frombits(binary.LittleEndian.Uint64(b[8:16])))
}

// newestWindow reads a fixed window's counts (see win_key in state.lua):
// the highest window number with a key beside key, and that window's
// count; -1 and 0 when there is none.
func newestWindow(t testing.TB, c goredis.UniversalClient, key string) (w int64, count uint64) {
	t.Helper()
	ctx := context.Background()
	glob := strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`).Replace(key)
	node := goredis.Cmdable(c)
	if cc, ok := c.(*goredis.ClusterClient); ok {
		// KEYS asks one node: the one whose slot key's hash tag names.
		n, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		node = n
	}
	keys, err := node.Keys(ctx, glob+"|*").Result()
	if err != nil {
		t.Fatalf("KEYS %s|*: %v", key, err)
	}
	w = -1
	for _, k := range keys {
		fw, err := strconv.ParseInt(k[len(key)+1:], 10, 64)
		if err != nil {
			continue // KEY|h, held hits
		}
		if fw > w {
			v, err := node.Get(ctx, k).Result()
			if err == goredis.Nil {
				continue // expired since
			}
			n, err2 := strconv.ParseUint(v, 10, 64)
			if err != nil || err2 != nil {
				t.Fatalf("GET %s = %q: %v %v, want a count", k, v, err, err2)
			}
			w, count = fw, n
		}
	}
	return w, count
}

// TestLeaseMatchesMemoryStore runs one random schedule of hits, checks,
// refunds, shadow hits, all-or-nothing batches and dry runs on leased
// rules through one replica, against the embedded store: a single replica
// must decide exactly as without leases (a slice is budget only it can
// spend, and what it does not fit it asks Redis for), and on a fixed
// window answer the same remaining and times.
func TestLeaseMatchesMemoryStore(t *testing.T) {
	rules := []limiter.Rule{
		{Algorithm: limiter.FixedWindow, Limit: 40, Period: 10 * time.Second, Lease: "fw"},
		{Algorithm: limiter.SlidingWindow, Limit: 40, Period: 10 * time.Second, Lease: "sw"},
		{Algorithm: limiter.FixedWindow, Limit: 7, Period: time.Minute, Lease: "small"},
		{Algorithm: limiter.FixedWindow, Limit: 9, Period: time.Minute}, // not leased, in the same batches
	}
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { leaseDifferential(t, rules, seed) })
	}
}

func leaseDifferential(t *testing.T, rules []limiter.Rule, seed uint64) {
	srv := redistest.Start(t)
	// The schedule's clock moves 150 ms per batch on average: slices sized
	// for 2 s of it hold a few hits each.
	rs := newStore(t, single(t, srv), Options{LeaseInterval: 2 * time.Second, LeaseIdle: time.Hour})
	mem := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
	defer mem.Close()
	rng := rand.New(rand.NewPCG(7, 11+seed))
	now := limitertest.T0
	prefix := fmt.Sprintf("lease:%d:", time.Now().UnixNano())
	before := scriptCalls(t, srv)
	local := 0
	for step := range 2000 {
		now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
		n := 1 + rng.IntN(3)
		hits := make([]limiter.Hit, n)
		for i := range hits {
			ri := rng.IntN(len(rules))
			if rng.IntN(3) > 0 {
				ri = rng.IntN(2) // mostly the two busy keys
			}
			hits[i] = limiter.Hit{Key: fmt.Sprintf("%s{k%d}", prefix, ri), Rule: rules[ri],
				Cost: uint64(rng.IntN(4)), Refund: rng.IntN(6) == 0, Advisory: rng.IntN(8) == 0}
		}
		b := limiter.Batch{Now: now, Hits: hits, AllOrNothing: rng.IntN(3) == 0, DryRun: rng.IntN(10) == 0}
		want, err := mem.Apply(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		calls := scriptCalls(t, srv)
		got, err := rs.Apply(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		if scriptCalls(t, srv) == calls {
			local++
		}
		for i := range hits {
			same := got[i].Allowed == want[i].Allowed
			if hits[i].Rule.Algorithm == limiter.FixedWindow {
				same = got[i] == want[i]
			}
			if !same {
				t.Fatalf("step %d at T0+%v, hit %d of batch %+v:\nleased %+v\nmemory %+v", step, now.Sub(limitertest.T0), i, b, got, want)
			}
		}
	}
	// A slice is at most a sixteenth of its limit (2 hits of 40, 1 of 7):
	// fewer batches fit in one than in a busy key's, but some must.
	if local < 120 {
		t.Errorf("only %d of 2000 batches were answered without Redis: the slices are not used", local)
	}
	t.Logf("%d of 2000 batches answered from slices; %d script calls; %+v", local, scriptCalls(t, srv)-before, rs.LeaseStats())
}

// hammer has workers goroutines per replica send attempts unit hits each
// on key under r, through the replicas' own clocks, and returns how many
// were allowed and how many failed.
func hammer(t *testing.T, replicas []*Store, key string, r limiter.Rule, workers, attempts int, during func(done int64)) (allowed, failed int64) {
	t.Helper()
	var ok, bad, done atomic.Int64
	var wg sync.WaitGroup
	for _, s := range replicas {
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range attempts {
					out, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: key, Rule: r, Cost: 1}}})
					switch {
					case err != nil:
						bad.Add(1)
					case out[0].Allowed:
						ok.Add(1)
					}
					if n := done.Add(1); during != nil {
						during(n)
					}
				}
			}()
		}
	}
	wg.Wait()
	return ok.Load(), bad.Load()
}

// testReplicasNeverPassTheLimit has three replicas, each with its own
// client, hammer one leased key at over three times its limit in one
// window: exactly as many hits may be allowed as the limit, at least 98%
// of it must be, and once the replicas have given their slices back,
// Redis's count is exactly what was allowed.
func testReplicasNeverPassTheLimit(t *testing.T, newClient func() goredis.UniversalClient) {
	for _, alg := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			const limit = 3000
			r := limiter.Rule{Algorithm: alg, Limit: limit, Period: time.Hour, Lease: "hot"}
			c := newClient()
			var replicas []*Store
			for range 3 {
				replicas = append(replicas, newStore(t, newClient(), leaseOptions()))
			}
			key := fmt.Sprintf("{hot%d}:%s", time.Now().UnixNano(), alg)
			allowed, failed := hammer(t, replicas, key, r, 8, 400, nil)
			if failed > 0 {
				t.Fatalf("%d calls failed", failed)
			}
			if allowed > limit || allowed < limit*98/100 {
				t.Errorf("3 replicas, 9,600 hits on a limit of %d: allowed %d, want at most %d and at least 98%%", limit, allowed, limit)
			}
			var slices uint64
			for _, s := range replicas {
				slices += s.LeaseStats()["hot"].Slices
				s.Close()
			}
			if slices == 0 {
				t.Error("no slice was taken: the test does not exercise leases")
			}
			if got := windowCount(t, c, key); got != uint64(allowed) {
				t.Errorf("after every slice went back, Redis counts %d, want the %d allowed", got, allowed)
			}
		})
	}
}

func sentinelClient(t *testing.T, st *redistest.Sentinel) goredis.UniversalClient {
	t.Helper()
	c, err := NewClient(ClientOptions{URL: st.MasterName + "," + strings.Join(st.SentinelAddrs(), ","), Type: "sentinel", PoolSize: 16, Timeout: testTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestLeaseOnEveryTopology runs the lease tests on a single node, a
// 3-master Cluster and Sentinel: replicas never pass the limit; a killed
// replica's slice is lost, never counted twice; a reload gives back; idle
// slices go back; with Redis down a replica admits only what its slice
// holds (last: it stops the servers).
func TestLeaseOnEveryTopology(t *testing.T) {
	for _, topo := range []string{"single", "cluster", "sentinel"} {
		t.Run(topo, func(t *testing.T) {
			var client func() goredis.UniversalClient
			var stop func()
			switch topo {
			case "single":
				srv := redistest.Start(t)
				client, stop = func() goredis.UniversalClient { return single(t, srv) }, srv.Stop
			case "cluster":
				nodes := redistest.StartCluster(t, 3)
				var addrs []string
				for _, n := range nodes {
					addrs = append(addrs, n.Addr)
				}
				client = func() goredis.UniversalClient {
					c, err := NewClient(ClientOptions{URL: strings.Join(addrs, ","), Type: "cluster", PoolSize: 16, Timeout: testTimeout})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { c.Close() })
					return c
				}
				stop = func() {
					for _, n := range nodes {
						n.Stop()
					}
				}
			case "sentinel":
				st := redistest.StartSentinel(t)
				client = func() goredis.UniversalClient { return sentinelClient(t, st) }
				stop = func() { st.Master.Stop(); st.Replica.Stop() }
			}
			t.Run("replicas never pass the limit", func(t *testing.T) { testReplicasNeverPassTheLimit(t, client) })
			t.Run("replica killed", func(t *testing.T) { testReplicaKilled(t, client()) })
			t.Run("reload gives back", func(t *testing.T) { testReloadGivesBack(t, client()) })
			t.Run("idle and close give back", func(t *testing.T) { testIdleAndCloseGiveBack(t, client()) })
			t.Run("refund through another replica", func(t *testing.T) { testRefundKeepsSlices(t, client()) })
			t.Run("redis down", func(t *testing.T) { testRedisDown(t, client(), stop) })
		})
	}
}

// takeSlice sends two hits 1 ms apart at T0: the second one's call asks
// for a slice sized from the rate since the first (50 hits for 50 ms,
// under half of what remains of r's limit of 1,000).
func takeSlice(t *testing.T, s *Store, key string, r limiter.Rule) {
	t.Helper()
	for _, at := range []time.Duration{0, time.Millisecond} {
		if out := applyAt(t, s, key, r, at); !out.Allowed {
			t.Fatalf("hit at T0+%v rejected", at)
		}
	}
	if got := s.LeaseStats()[r.Lease].Leased; got != 50 {
		t.Fatalf("leased %d hits, want a slice of 50", got)
	}
}

func applyAt(t *testing.T, s *Store, key string, r limiter.Rule, at time.Duration) limiter.Outcome {
	t.Helper()
	out, err := s.Apply(context.Background(), limiter.Batch{Now: limitertest.T0.Add(at), Hits: []limiter.Hit{{Key: key, Rule: r, Cost: 1}}})
	if err != nil {
		t.Fatalf("hit at T0+%v: %v", at, err)
	}
	return out[0]
}

// spend sends unit hits at T0+at on until one is rejected (at most n)
// and returns how many were allowed.
func spend(t *testing.T, s *Store, key string, r limiter.Rule, at time.Duration, n int) int {
	t.Helper()
	allowed := 0
	for i := range n {
		if !applyAt(t, s, key, r, at+time.Duration(i)*time.Microsecond).Allowed {
			break
		}
		allowed++
	}
	return allowed
}

var leased1000 = limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 1000, Period: time.Minute, Lease: "hot"}

// With Redis gone, a replica admits what its slice holds, no more: those
// hits were counted before Redis went away.
func testRedisDown(t *testing.T, c goredis.UniversalClient, stop func()) {
	s := newStore(t, c, leaseOptions())
	key := "{down}:fw60"
	takeSlice(t, s, key, leased1000)
	stop()
	allowed := 0
	for i := range 200 {
		out, err := s.Apply(context.Background(), limiter.Batch{Now: limitertest.T0.Add(2*time.Millisecond + time.Duration(i)*time.Microsecond),
			Hits: []limiter.Hit{{Key: key, Rule: leased1000, Cost: 1}}})
		if err != nil {
			break
		}
		if !out[0].Allowed {
			t.Fatalf("hit %d rejected while the slice held budget", i)
		}
		allowed++
	}
	if allowed != 50 {
		t.Errorf("with Redis down, allowed %d hits, want exactly the slice's 50, then errors", allowed)
	}
}

// A replica killed while it holds a slice loses it: the others can spend
// only what it did not take, and nothing is counted twice.
func testReplicaKilled(t *testing.T, c goredis.UniversalClient) {
	key := "{killed}:fw60"
	a, err := New(c, leaseOptions())
	if err != nil {
		t.Fatal(err)
	}
	takeSlice(t, a, key, leased1000)
	if got := spend(t, a, key, leased1000, 2*time.Millisecond, 10); got != 10 {
		t.Fatalf("a spent %d of its slice, want 10", got)
	}
	// Killed: its sweeper stops and nothing is given back.
	a.stop()
	<-a.swept
	counted := windowCount(t, c, key)
	if counted != 52 {
		t.Fatalf("Redis counts %d, want 2 hits and a slice of 50", counted)
	}
	b := newStore(t, c, leaseOptions())
	got := spend(t, b, key, leased1000, 3*time.Millisecond, 2000)
	if want := 1000 - 52; got != want {
		t.Errorf("after a's death b allowed %d, want the %d that a's hits and slice left", got, want)
	}
	b.Close()
	if n := windowCount(t, c, key); n != 1000 {
		t.Errorf("Redis counts %d, want the full 1000: a's 12, its lost 40, b's %d", n, got)
	}
}

// A refund sent through another replica never frees budget a replica
// holds as a slice: a holds 40 unspent hits of a slice of 50 when b
// refunds 1,000; the refund gives back only the hits Redis decided itself,
// and a's slice and b's hits together stay within the limit. On both
// window algorithms.
func testRefundKeepsSlices(t *testing.T, c goredis.UniversalClient) {
	for _, r := range []limiter.Rule{leased1000,
		{Algorithm: limiter.SlidingWindow, Limit: 1000, Period: time.Minute, Lease: "hot-sliding"}} {
		t.Run(r.Algorithm.String(), func(t *testing.T) {
			key := "{refund-" + r.Algorithm.String() + "}:w60"
			a, b := newStore(t, c, leaseOptions()), newStore(t, c, leaseOptions())
			takeSlice(t, a, key, r)
			if got := spend(t, a, key, r, 2*time.Millisecond, 10); got != 10 {
				t.Fatalf("a spent %d of its slice, want 10", got)
			}
			out, err := b.Apply(context.Background(), limiter.Batch{Now: limitertest.T0.Add(3 * time.Millisecond),
				Hits: []limiter.Hit{{Key: key, Rule: r, Cost: 1000, Refund: true}}})
			if err != nil || !out[0].Allowed {
				t.Fatalf("refund through b: %v %v", out, err)
			}
			if n := windowCount(t, c, key); n != 50 {
				t.Errorf("after the refund Redis counts %d, want the 50 of a's slice", n)
			}
			bAllowed := spend(t, b, key, r, 4*time.Millisecond, 2000)
			aAllowed := spend(t, a, key, r, 5*time.Millisecond, 100)
			// b: what the slice does not hold; a: the 40 it still holds,
			// and nothing more from Redis.
			if bAllowed != 950 || aAllowed != 40 {
				t.Errorf("after the refund b allowed %d and a %d, want 950 and 40: the refund must not free a's slice", bAllowed, aAllowed)
			}
		})
	}
}

// A reload that changes the limit gives the old slice back before the
// first hit under the new rule is decided.
func testReloadGivesBack(t *testing.T, c goredis.UniversalClient) {
	s := newStore(t, c, leaseOptions())
	key := "{reload}:fw60"
	takeSlice(t, s, key, leased1000)
	if got := spend(t, s, key, leased1000, 2*time.Millisecond, 5); got != 5 {
		t.Fatalf("spent %d of the slice, want 5", got)
	}
	lower := leased1000
	lower.Limit = 20
	if !applyAt(t, s, key, lower, 3*time.Millisecond).Allowed {
		t.Fatal("first hit under the new limit rejected")
	}
	// 7 allowed under the old limit, 1 under the new: the slice's other
	// 45 went back in the same request.
	if n := windowCount(t, c, key); n != 8 {
		t.Errorf("Redis counts %d after the reload's first hit, want 8", n)
	}
	got := spend(t, s, key, lower, 4*time.Millisecond, 100)
	if got != 12 {
		t.Errorf("under the new limit of 20, %d more allowed, want 12", got)
	}
	if st := s.LeaseStats()["hot"]; st.Returned < 45 {
		t.Errorf("returned %d hits, want at least the 45 of the old slice", st.Returned)
	}
}

// A slice unused for LeaseIdle goes back at the next sweep; every slice
// goes back at Close.
func testIdleAndCloseGiveBack(t *testing.T, c goredis.UniversalClient) {
	s := newStore(t, c, leaseOptions())
	takeSlice(t, s, "{idle}:fw60", leased1000)
	takeSlice(t, s, "{closed}:fw60", limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 1000, Period: time.Minute, Lease: "other"})
	if got := spend(t, s, "{idle}:fw60", leased1000, 2*time.Millisecond, 3); got != 3 {
		t.Fatal("slice not spent")
	}
	// Not idle yet at T0+1s-1ms: nothing goes back.
	s.sweepLeases(context.Background(), limitertest.T0.Add(time.Second), time.Second)
	if n := windowCount(t, c, "{idle}:fw60"); n != 52 {
		t.Errorf("before the slice was idle for 1 s, Redis counts %d, want 52", n)
	}
	s.sweepLeases(context.Background(), limitertest.T0.Add(time.Second+10*time.Millisecond), time.Second)
	if n := windowCount(t, c, "{idle}:fw60"); n != 5 {
		t.Errorf("after an idle sweep, Redis counts %d, want the 5 allowed", n)
	}
	if st := s.LeaseStats()["hot"]; st.Returned != 47 || st.Held != 0 {
		t.Errorf("lease stats %+v, want 47 returned and nothing held", st)
	}
	s.sweepLeases(context.Background(), limitertest.T0.Add(0), 0) // what Close does, at the slices' own time
	if n := windowCount(t, c, "{closed}:fw60"); n != 2 {
		t.Errorf("after giving every slice back, Redis counts %d, want the 2 allowed", n)
	}
}

// The slice ends when its window ends in Redis, whatever the replica's
// clock says: a replica an hour behind takes a slice on a 1 s window
// (Redis's clock decides), and once Redis's window is over its next hit
// goes to Redis.
func TestLeaseEndsWithRedisWindow(t *testing.T) {
	srv := redistest.Start(t)
	c := single(t, srv)
	skewed := func() time.Time { return time.Now().Add(-time.Hour) }
	opts := leaseOptions()
	opts.Clock = skewed
	s := newStore(t, c, opts)
	r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 1_000_000, Period: time.Second, Lease: "hot"}
	key := "{skew}:fw1"
	hit := func() limiter.Outcome {
		out, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: key, Rule: r, Cost: 1}}})
		if err != nil || !out[0].Allowed {
			t.Fatalf("hit: %+v %v", out, err)
		}
		return out[0]
	}
	redisWindow := func() int64 {
		tm, err := c.Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.Unix()
	}
	for range 3 {
		hit()
	}
	if s.LeaseStats()["hot"].Slices == 0 {
		t.Fatal("no slice taken")
	}
	w := redisWindow()
	calls := scriptCalls(t, srv)
	hit()
	if redisWindow() == w && scriptCalls(t, srv) != calls {
		t.Fatal("a hit within the slice's window went to Redis")
	}
	for deadline := time.Now().Add(3 * time.Second); redisWindow() == w; {
		if time.Now().After(deadline) {
			t.Fatal("Redis's clock did not move to the next second")
		}
		time.Sleep(10 * time.Millisecond) // waiting for Redis's clock, not for our code
	}
	calls = scriptCalls(t, srv)
	hit()
	if scriptCalls(t, srv) == calls {
		t.Error("after Redis's window ended, a hit was still answered from the old slice")
	}
}

// A Sentinel failover (writes paused until the replica has them, then
// promoted) in the middle of a hot key's window: the slices taken before
// it stay counted on the new master, and the window never passes its
// limit.
func TestLeaseSentinelFailover(t *testing.T) {
	st := redistest.StartSentinel(t)
	const limit = 3000
	r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: limit, Period: time.Hour, Lease: "hot"}
	var replicas []*Store
	for range 3 {
		replicas = append(replicas, newStore(t, sentinelClient(t, st), leaseOptions()))
	}
	key := fmt.Sprintf("{failover%d}:fw3600", time.Now().UnixNano())
	before, _ := hammer(t, replicas, key, r, 4, 80, nil)
	if _, err := st.Master.Do("CLIENT", "PAUSE", "10000", "WRITE"); err != nil {
		t.Fatal(err)
	}
	// Then wait until the replica has every write (WAIT is paused too).
	offset := func(s *redistest.Server, field string) string {
		info, err := s.Do("INFO", "replication")
		if err != nil {
			return err.Error()
		}
		for _, l := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(l, field+":"); ok {
				return v
			}
		}
		return ""
	}
	for deadline := time.Now().Add(10 * time.Second); offset(st.Master, "master_repl_offset") != offset(st.Replica, "slave_repl_offset"); {
		if time.Now().After(deadline) {
			info, _ := st.Replica.Do("INFO", "replication")
			t.Fatalf("the replica did not catch up with the paused master: %q vs %q (%q)", offset(st.Master, "master_repl_offset"), offset(st.Replica, "slave_repl_offset"), info)
		}
		time.Sleep(20 * time.Millisecond) // readiness polling
	}
	// A sentinel refreshes what it knows of the replica every few seconds:
	// until it has seen it in sync, it finds no replica to promote.
	for deadline := time.Now().Add(15 * time.Second); ; {
		_, err := st.Sentinels[0].Do("SENTINEL", "FAILOVER", st.MasterName)
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "NOGOODSLAVE") || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // readiness polling
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		role, _ := st.Replica.Do("ROLE")
		if strings.Contains(role, "master") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica was not promoted: %q", role)
		}
		time.Sleep(50 * time.Millisecond) // readiness polling
	}
	after, failed := hammer(t, replicas, key, r, 8, 400, nil)
	if allowed := before + after; allowed > limit {
		t.Errorf("allowed %d across the failover, over the limit of %d", allowed, limit)
	} else if after == 0 {
		t.Errorf("nothing allowed after the failover (%d calls failed)", failed)
	}
	for _, s := range replicas {
		s.Close()
	}
	promoted := goredis.NewClient(&goredis.Options{Addr: st.Replica.Addr})
	defer promoted.Close()
	if n := windowCount(t, promoted, key); n < uint64(before+after) {
		t.Errorf("the new master counts %d, fewer than the %d allowed", n, before+after)
	}
	t.Logf("allowed %d before and %d after the failover; %d calls failed during it", before, after, failed)
}

// TestLeaseGiveBackAfterRestart: a slice taken before Redis restarts
// without persistence comes back to a counter that never granted it. It
// frees nothing there, not even what the other replica's slices hold in
// the new counter, so the window admits at most its limit after the
// restart (it freed the slice's unspent hits, 40 over the limit, before).
func TestLeaseGiveBackAfterRestart(t *testing.T) {
	srv := redistest.Start(t)
	c := single(t, srv)
	key := "{restart}:fw60"
	a := newStore(t, c, leaseOptions())
	takeSlice(t, a, key, leased1000)
	if got := spend(t, a, key, leased1000, 2*time.Millisecond, 10); got != 10 {
		t.Fatalf("a spent %d of its slice, want 10", got)
	}
	srv.Restart()
	b := newStore(t, c, leaseOptions())
	bAllowed := spend(t, b, key, leased1000, 3*time.Millisecond, 2000)
	if bAllowed != 1000 {
		t.Fatalf("b allowed %d in the restarted counter, want its limit, 1000", bAllowed)
	}
	a.sweepLeases(context.Background(), limitertest.T0.Add(4*time.Millisecond), 0) // a gives back its 40 unspent
	if got := a.LeaseStats()["hot"].Returned; got != 40 {
		t.Fatalf("a gave back %d, want its 40 unspent", got)
	}
	if more := spend(t, b, key, leased1000, 5*time.Millisecond, 100); more != 0 {
		t.Errorf("after a gave back a slice of the forgotten counter, b allowed %d more: %d in a window of 1000", more, bAllowed+more)
	}
}

// TestLeaseBurstThenKilled: concurrent first hits on a key (one batch,
// microseconds after the hit that started the replica's clock) take a
// slice of at most a sixteenth of the limit, not the half of it that a
// rate measured over microseconds asked for; the replica then dies holding
// it, and the other spends everything else.
func TestLeaseBurstThenKilled(t *testing.T) {
	srv := redistest.Start(t)
	c := single(t, srv)
	key := "{burst}:fw60"
	a, err := New(c, leaseOptions()) // never closed: it dies holding its slice
	if err != nil {
		t.Fatal(err)
	}
	applyAt(t, a, key, leased1000, 0)
	burst := limiter.Batch{Now: limitertest.T0.Add(5 * time.Microsecond)}
	for range 6 {
		burst.Hits = append(burst.Hits, limiter.Hit{Key: key, Rule: leased1000, Cost: 1})
	}
	if _, err := a.Apply(context.Background(), burst); err != nil {
		t.Fatal(err)
	}
	stranded := a.LeaseStats()["hot"].Leased
	if stranded == 0 || stranded > maxSlice(leased1000.Limit) {
		t.Fatalf("a burst of 6 took a slice of %d of 1000, want 1 to %d", stranded, maxSlice(leased1000.Limit))
	}
	b := newStore(t, c, leaseOptions())
	if got, want := spend(t, b, key, leased1000, time.Millisecond, 2000), 1000-7-int(stranded); got != want {
		t.Errorf("after a died holding %d, b allowed %d, want the rest: %d", stranded, got, want)
	}
}

// TestLeaseWant: how a replica sizes the slice it asks for.
func TestLeaseWant(t *testing.T) {
	const interval = 50 * time.Millisecond
	t0 := limitertest.T0
	for _, tc := range []struct {
		name    string
		limit   uint64
		seen    uint64
		elapsed time.Duration
		until   time.Duration // the window's end, from the ask
		want    uint64
	}{
		{"no rate yet", 1_000_000, 0, -1, time.Hour, 0},
		{"a steady rate: an interval's worth", 1_000_000, 100, 100 * time.Millisecond, time.Hour, 50},
		{"the window ends first", 1_000_000, 100, 50 * time.Millisecond, 10 * time.Millisecond, 20},
		{"concurrent arrivals: a rate over a millisecond at least", 1_000_000, 5, 10 * time.Microsecond, time.Hour, 250},
		{"at most a sixteenth of the limit", 1000, 5, 10 * time.Microsecond, time.Hour, 62},
		{"a small limit: one", 7, 5, 10 * time.Microsecond, time.Hour, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := t0.Add(time.Second)
			sl := &leaseSlice{sliceFields: sliceFields{rule: limiter.Rule{Limit: tc.limit}, seen: tc.seen, until: now.Add(tc.until)}}
			if tc.elapsed >= 0 {
				sl.since = now.Add(-tc.elapsed)
			}
			l := newLeases(interval, time.Hour, time.Now)
			if got := l.want(sl, now); got != tc.want {
				t.Errorf("want(%d hits over %v, limit %d) = %d, want %d", tc.seen, tc.elapsed, tc.limit, got, tc.want)
			}
		})
	}
}

// TestAnswerBytes: a reply is 4 doubles a hit, and a fifth after a hit
// granted a slice; a merged call's reply is split by it, and parseOutcomes
// reads the slice's window and generation from it.
func TestAnswerBytes(t *testing.T) {
	doubles := func(vs ...float64) string {
		b := make([]byte, 8*len(vs))
		putDoubles(b, vs...)
		return string(b)
	}
	allowed, rejected := doubles(1, 9, 1e6, 0), doubles(0, 0, 1e6, 5e5)
	granted := doubles(51, 900, 1e6, 28_000_000) + doubles(1.7e15)
	for _, tc := range []struct {
		name  string
		reply string
		hits  int
		n     int
		whole bool
	}{
		{"allowed and rejected", allowed + rejected, 2, 64, true},
		{"a grant takes five doubles", granted + allowed, 2, 72, true},
		{"the first hits of more", granted + allowed + rejected, 1, 40, true},
		{"a grant without its generation", granted[:32], 1, 0, false},
		{"short", allowed[:31], 1, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, whole := answerBytes(tc.reply, tc.hits)
			if n != tc.n || whole != tc.whole {
				t.Errorf("answerBytes = %d, %v; want %d, %v", n, whole, tc.n, tc.whole)
			}
		})
	}
	grants := make([]grant, 2)
	outs, err := parseOutcomes(granted+rejected, 2, grants)
	if err != nil {
		t.Fatal(err)
	}
	if g := grants[0]; g != (grant{extra: 50, window: 28_000_000, gen: 1.7e15}) || !outs[0].Allowed || outs[0].RetryAfter != 0 || outs[1].Allowed {
		t.Errorf("parsed %+v and grants %+v", outs, grants)
	}
	if _, err := parseOutcomes(granted+rejected+allowed, 2, grants); err == nil {
		t.Error("a reply with a hit too many parsed")
	}
}
