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
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// The fixed window has one writer's lifecycle (plain.go): a window's count
// is its own key, KEY|w, with its TTL from the transaction that made it.
// These tests interleave the routes a hit can take (plain, the function)
// on one key, with an estimate of Redis's clock behind and ahead, a
// stalled Redis and a clock that jumps, and check that no window admits
// past its limit.

// redisNow is Redis's TIME.
func redisNow(t testing.TB, c goredis.UniversalClient) time.Time {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// skewClock sets rc's reading to Redis's clock moved by off: an estimate
// that far behind (off < 0) or ahead.
func skewClock(t testing.TB, c goredis.UniversalClient, rc *redisClock, off time.Duration) {
	t.Helper()
	now := redisNow(t, c)
	rc.reading.Store(&clockReading{redis: now.Add(off).UnixMicro(), local: time.Now()})
}

// A plain hit counts in its window's key, which expires when the window
// ends, in one transaction: no other key is written, nothing is sent
// after it.
func TestPlainWindowKeyAndTTL(t *testing.T) {
	srv := redistest.Start(t)
	c := single(t, srv)
	s := newStore(t, c, Options{})
	plainReady(t, s)
	r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 10, Period: time.Hour, CountRejected: true}
	for range 5 { // until one run stays in one hour-long window
		before := redisNow(t, c)
		if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
			t.Fatal(err)
		}
		out, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: "{ttl}:k", Rule: r, Cost: 3}}})
		if err != nil {
			t.Fatal(err)
		}
		after := redisNow(t, c)
		w := before.Unix() / 3600
		if after.Unix()/3600 != w {
			continue
		}
		keys, err := c.Keys(context.Background(), "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		want := keyVersion + "{ttl}:k|" + strconv.FormatInt(w, 10)
		if len(keys) != 1 || keys[0] != want {
			t.Fatalf("keys %v, want only %s", keys, want)
		}
		if n, err := c.Get(context.Background(), want).Int64(); err != nil || n != 3 {
			t.Errorf("%s = %d (%v), want 3", want, n, err)
		}
		end := time.Unix((w+1)*3600, 0)
		at, err := c.PExpireTime(context.Background(), want).Result()
		if err != nil {
			t.Fatal(err)
		}
		if exp := time.UnixMilli(int64(at / time.Millisecond)); exp.Before(end) || exp.After(end.Add(time.Millisecond)) {
			t.Errorf("%s expires at %v, want the window's end %v", want, exp, end)
		}
		if o := out[0]; !o.Allowed || o.Remaining != 7 || o.ResetAfter <= 0 || o.ResetAfter > end.Sub(before) {
			t.Errorf("outcome = %+v, want allowed, 7 left, reset by the window's end", o)
		}
		st, err := srv.CommandStats()
		if err != nil {
			t.Fatal(err)
		}
		if calls, _ := redistest.ScriptCalls(st); calls != 0 || st["multi"].Calls != 1 || st["exec"].Calls != 1 {
			t.Errorf("script calls %d, MULTI %d, EXEC %d: want one transaction and no script", calls, st["multi"].Calls, st["exec"].Calls)
		}
		return
	}
	t.Fatal("no run stayed within one hour-long window")
}

// An estimate of Redis's clock a window or more behind or ahead (a clock
// that jumped) stamps plain hits with the wrong window; TIME in their
// transaction says so, and the function decides them on Redis's clock:
// exactly the limit is admitted, all counted in Redis's window, and
// nothing is left in the window that had ended.
func TestPlainWrongEstimateTakesTheFunction(t *testing.T) {
	for _, off := range []time.Duration{-25 * time.Hour, -time.Hour, time.Hour, 25 * time.Hour} {
		for _, batched := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/batched=%v", off, batched), func(t *testing.T) {
				srv := redistest.Start(t)
				c := single(t, srv)
				s := newStore(t, c, Options{Batch: batched})
				plainReady(t, s)
				r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 3, Period: time.Hour, CountRejected: true}
				for range 5 { // until one run stays in one hour-long window
					if err := c.FlushAll(context.Background()).Err(); err != nil {
						t.Fatal(err)
					}
					before := redisNow(t, c)
					allowed := 0
					for range 6 {
						skewClock(t, c, s.rclock, off) // each hit: the estimate is read again after a miss
						out, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: "{skew}:k", Rule: r, Cost: 1}}})
						if err != nil {
							t.Fatal(err)
						}
						if out[0].Allowed {
							allowed++
						}
					}
					w := before.Unix() / 3600
					if redisNow(t, c).Unix()/3600 != w {
						continue
					}
					if allowed != 3 {
						t.Errorf("%d of 6 admitted on a limit of 3", allowed)
					}
					key := keyVersion + "{skew}:k|"
					if n, err := c.Get(context.Background(), key+strconv.FormatInt(w, 10)).Int64(); err != nil || n != 6 {
						t.Errorf("Redis's window counted %d (%v), want 6", n, err)
					}
					if off < 0 {
						ended := key + strconv.FormatInt(w+int64(off/time.Hour), 10)
						if n, err := c.Exists(context.Background(), ended).Result(); err != nil || n != 0 {
							t.Errorf("the ended window's key exists (%d, %v): want it gone", n, err)
						}
					}
					return
				}
				t.Fatal("no run stayed within one hour-long window")
			})
		}
	}
}

// A Redis stalled across a window's edge (SIGSTOP, as a paused VM or a
// long fork does) under a long REDIS_TIMEOUT runs a plain hit stamped
// with the window before it: that hit must meet the count of the window it
// ran in, not start the earlier window's from zero. Every window after the
// hit's is already at its limit (other replicas' hits), so the one right
// answer is a rejection.
func TestPlainStalledRedisAcrossAnEdge(t *testing.T) {
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
			srv := redistest.Start(t)
			c := single(t, srv)
			s := newStore(t, c, Options{Batch: batched, Timeout: 30 * time.Second})
			plainReady(t, s)
			r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 5, Period: time.Second, CountRejected: true}
			est, _ := s.rclock.now(context.Background())
			w := est/1e6 + 1
			for i := w + 1; i < w+60; i++ { // the windows after w, full
				if err := c.Set(context.Background(), windowKey(keyVersion+"{stall}:k", i), 5, time.Minute+time.Duration(i-w)*time.Second).Err(); err != nil {
					t.Fatal(err)
				}
			}
			// Start in window w, by the estimate, with most of it to go.
			for e, _ := s.rclock.now(context.Background()); e/1e6 < w; e, _ = s.rclock.now(context.Background()) {
				time.Sleep(time.Millisecond)
			}
			srv.Pause()
			done := make(chan limiter.Outcome, 1)
			errs := make(chan error, 1)
			go func() {
				out, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: "{stall}:k", Rule: r, Cost: 1}}})
				if err != nil {
					errs <- err
					return
				}
				done <- out[0]
			}()
			// Resume once window w has ended by Redis's clock (the process's
			// clock runs beside it while Redis is stopped).
			for e, _ := s.rclock.now(context.Background()); e < (w+1)*1e6+200_000; e, _ = s.rclock.now(context.Background()) {
				time.Sleep(5 * time.Millisecond)
			}
			srv.Resume()
			select {
			case o := <-done:
				if o.Allowed {
					t.Errorf("the stalled hit was admitted (%+v): it ran in a window already at its limit", o)
				}
			case err := <-errs:
				t.Fatal(err)
			}
			if n, err := c.Exists(context.Background(), windowKey(keyVersion+"{stall}:k", w)).Result(); err != nil || n != 0 {
				t.Errorf("the stamped window's key exists (%d, %v) after its window ended: want it gone", n, err)
			}
		})
	}
}

// Writers of one key on every route at once: replicas on the plain path
// whose estimates are behind and ahead of Redis's clock by a round trip,
// and a replica whose hits take the function (a sliding-window rule beside
// them in each request), over several per-second windows. Each admitted
// hit's count is its window's true count: no two admitted hits of one
// window see the same count, and no window admits past its limit.
func TestWritersInterleavedOnOneKey(t *testing.T) {
	srv := redistest.Start(t)
	c := single(t, srv)
	const limit = 10
	fixed := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: limit, Period: time.Second, CountRejected: true}
	sliding := limiter.Rule{Algorithm: limiter.SlidingWindow, Limit: 1 << 30, Period: time.Second, CountRejected: true}
	type answer struct {
		end       int64 // the window's end, µs by Redis's clock, rounded to the period
		remaining uint64
	}
	var mu sync.Mutex
	var admitted []answer
	var wg sync.WaitGroup
	stores := []struct {
		skew     time.Duration
		function bool
	}{{-time.Millisecond, false}, {time.Millisecond, false}, {0, true}, {-time.Millisecond, true}}
	first := redisNow(t, c).UnixMicro()
	for i, st := range stores {
		s := newStore(t, c, Options{Batch: i%2 == 0})
		plainReady(t, s)
		if st.skew != 0 {
			skewClock(t, c, s.rclock, st.skew)
		}
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; n < 10_000; n++ { // about three windows, at most 10,000 requests
					time.Sleep(time.Millisecond) // a steady rate, not a busy loop
					hits := []limiter.Hit{{Key: "{mix}:k", Rule: fixed, Cost: 1}}
					if st.function {
						hits = append(hits, limiter.Hit{Key: "{mix}:other", Rule: sliding, Cost: 1})
					}
					out, err := s.Apply(context.Background(), limiter.Batch{Hits: hits})
					est, _ := s.rclock.now(context.Background())
					if err != nil {
						t.Error(err)
						return
					}
					if est > first+3_500_000 {
						return
					}
					if o := out[0]; o.Allowed {
						// The window's end: the answer's reset from when it
						// was received, rounded to the nearest edge.
						end := (est + o.ResetAfter.Microseconds() + 500_000) / 1_000_000 * 1_000_000
						mu.Lock()
						admitted = append(admitted, answer{end, o.Remaining})
						mu.Unlock()
					}
				}
			}()
		}
	}
	wg.Wait()
	perWindow := map[int64]map[uint64]int{}
	for _, a := range admitted {
		if perWindow[a.end] == nil {
			perWindow[a.end] = map[uint64]int{}
		}
		perWindow[a.end][a.remaining]++
	}
	if len(perWindow) < 2 {
		t.Fatalf("admitted hits in %d windows, want several", len(perWindow))
	}
	for end, rems := range perWindow {
		n := 0
		for rem, k := range rems {
			n += k
			if k > 1 {
				t.Errorf("window ending %d: %d admitted hits saw %d remaining: a count started again", end, k, rem)
			}
		}
		if n > limit {
			t.Errorf("window ending %d admitted %d, limit %d", end, n, limit)
		}
	}
}

// The plain path and the function answer alike: the same hits, of random
// costs and limits, on two keys, one store deciding each hit on the plain
// path, the other (as if Redis had refused a plain command) through the
// function.
func TestPlainAndFunctionAnswerAlike(t *testing.T) {
	srv := redistest.Start(t)
	c := single(t, srv)
	plain := newStore(t, c, Options{})
	plainReady(t, plain)
	function := newStore(t, c, Options{})
	function.plainOff.Store(true)
	for range 5 { // until one run stays in one day-long window
		if err := c.FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		before := redisNow(t, c).Unix() / 86400
		mismatch := false
		for i := range 200 {
			r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: uint64(i % 7), Period: 24 * time.Hour, CountRejected: true}
			cost := uint64(1 + i*31%5)
			key := "{alike}:" + strconv.Itoa(i%3)
			a, err1 := plain.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: key + "p", Rule: r, Cost: cost}}})
			b, err2 := function.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: key + "f", Rule: r, Cost: cost}}})
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			if a[0].Allowed != b[0].Allowed || a[0].Remaining != b[0].Remaining || (a[0].RetryAfter > 0) != (b[0].RetryAfter > 0) {
				mismatch = true
				t.Errorf("hit %d (limit %d, cost %d): plain %+v, function %+v", i, r.Limit, cost, a[0], b[0])
			}
		}
		if redisNow(t, c).Unix()/86400 != before && !mismatch {
			continue
		}
		if st, err := srv.CommandStats(); err != nil || st["exec"].Calls < 200 {
			t.Errorf("%d transactions (%v): want the plain store's 200 hits on the plain path", st["exec"].Calls, err)
		}
		return
	}
	t.Fatal("no run stayed within one day-long window")
}

// Every plain hit carries its key's PEXPIREAT ... NX, even on a key the
// store has counted before: so a key Redis lost since (a flush here), made
// again by the next hit, has its TTL at once, as does one a transaction
// run late makes (TestNoKeyWithoutATTLAfterRedisStalls, through the
// binary).
func TestPlainHitsAlwaysCarryTheirTTL(t *testing.T) {
	srv := redistest.Start(t)
	c := single(t, srv)
	s := newStore(t, c, Options{})
	plainReady(t, s)
	r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 100, Period: time.Hour, CountRejected: true}
	hit := func() {
		t.Helper()
		if _, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: "{lost}:k", Rule: r, Cost: 1}}}); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 { // until one run stays in one hour-long window
		if err := c.FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		before := redisNow(t, c)
		if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			hit()
		}
		if err := c.FlushAll(context.Background()).Err(); err != nil { // Redis loses the key
			t.Fatal(err)
		}
		hit()
		st, err := srv.CommandStats()
		if err != nil {
			t.Fatal(err)
		}
		if redisNow(t, c).Unix()/3600 != before.Unix()/3600 {
			continue
		}
		if st["incrby"].Calls != 4 || st["pexpireat"].Calls != 4 {
			t.Errorf("4 hits on one window: INCRBY %d, PEXPIREAT %d; want 4 and 4", st["incrby"].Calls, st["pexpireat"].Calls)
		}
		wk := windowKey(keyVersion+"{lost}:k", before.Unix()/3600)
		if ttl, err := c.PTTL(context.Background(), wk).Result(); err != nil || ttl <= 0 {
			t.Errorf("the lost key, made again by a hit: PTTL %v (%v), want its TTL", ttl, err)
		}
		return
	}
	t.Fatal("no run stayed within one hour-long window")
}

// waitUntil polls cond for a background step, up to 30 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 30 s: %s", what)
		}
	}
}

// A Redis user whose ACL allows the function's commands but not the plain
// path's (MULTI, EXEC, PEXPIREAT) is decided by the function, from the
// first refusal on, and no decision fails.
func TestPlainRefusedByTheACL(t *testing.T) {
	srv := redistest.Start(t)
	if _, err := srv.Do("ACL", "SETUSER", "limited", "on", ">secret", "~*", "-@all", "+evalsha", "+eval", "+script|load", "+fcall",
		"+function|load", "+get", "+set", "+del", "+incrby", "+decrby", "+pexpire", "+time", "+ping", "+hello"); err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ClientOptions{URL: srv.Addr, Type: "single", Auth: "limited:secret", PoolSize: 4, Timeout: testTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c, Options{Batch: true})
	plainReady(t, s)
	r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 3, Period: 24 * time.Hour, CountRejected: true}
	allowed := 0
	for range 5 {
		out, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: "{acl}:k", Rule: r, Cost: 1}}})
		if err != nil {
			t.Fatalf("a decision failed: %v", err)
		}
		if out[0].Allowed {
			allowed++
		}
	}
	if !s.plainOff.Load() || allowed != 3 {
		t.Errorf("plain off %v, %d of 5 admitted: want the function from the refusal on, and 3", s.plainOff.Load(), allowed)
	}
}

// On Redis Cluster the default fixed window takes the function (a TIME
// must run in the counting transaction, on the node of its keys, and a
// transaction may not span slots): no transaction is sent, and exactly the
// limit is admitted per key.
func TestClusterTakesTheFunction(t *testing.T) {
	nodes, c := startCluster(t)
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
			s := newStore(t, c, Options{Batch: batched})
			knowsRedisClock(t, s.rclock)
			r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 3, Period: 24 * time.Hour, CountRejected: true}
			for _, n := range nodes {
				if _, err := n.Do("CONFIG", "RESETSTAT"); err != nil {
					t.Fatal(err)
				}
			}
			allowed := map[string]int{}
			for i := range 5 {
				var hits []limiter.Hit
				for k := range 12 { // twelve tags: every master gets some
					hits = append(hits, limiter.Hit{Key: fmt.Sprintf("{cl%v-%d}:k", batched, k), Rule: r, Cost: 1})
				}
				out, err := s.Apply(context.Background(), limiter.Batch{Hits: hits})
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				for j, o := range out {
					if o.Allowed {
						allowed[hits[j].Key]++
					}
				}
			}
			for k, n := range allowed {
				if n != 3 {
					t.Errorf("%s admitted %d of 5, limit 3", k, n)
				}
			}
			scripts, execs := 0, 0
			for _, n := range nodes {
				st, err := n.CommandStats()
				if err != nil {
					t.Fatal(err)
				}
				calls, _ := redistest.ScriptCalls(st)
				scripts, execs = scripts+calls, execs+st["exec"].Calls
			}
			if scripts == 0 || execs != 0 {
				t.Errorf("%d script calls, %d transactions: want the function's calls only", scripts, execs)
			}
		})
	}
}

// A count the plain path takes past limiter.MaxCount (hits of the largest
// cost) is set back to it, as the function does, so that a shared key
// never reaches INCRBY's overflow, where every decision on it would fail.
func TestPlainCountPastMaxIsSetBack(t *testing.T) {
	srv := redistest.Start(t)
	c := single(t, srv)
	s := newStore(t, c, Options{})
	plainReady(t, s)
	r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 10, Period: 24 * time.Hour, CountRejected: true}
	before := redisNow(t, c)
	for range 3 {
		out, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: "{max}:k", Rule: r, Cost: limiter.MaxCount}}})
		if err != nil || out[0].Allowed {
			t.Fatalf("a hit of the largest cost: %+v %v, want rejected", out, err)
		}
	}
	if st, err := srv.CommandStats(); err != nil || st["exec"].Calls == 0 {
		t.Fatalf("no transaction (%v): the hits did not take the plain path", err)
	}
	wk := windowKey(keyVersion+"{max}:k", before.Unix()/86400)
	waitUntil(t, "the count set back to limiter.MaxCount", func() bool {
		n, err := c.Get(context.Background(), wk).Int64()
		return err == nil && n == limiter.MaxCount
	})
	if ttl, err := c.PTTL(context.Background(), wk).Result(); err != nil || ttl <= 0 {
		t.Errorf("PTTL %v (%v) after the count was set back: want its TTL kept", ttl, err)
	}
}

// The permission probe leaves no key behind, whichever of the plain
// path's commands the ACL refuses, and says the path is off for good; with
// all of them allowed it says it may serve.
func TestPlainProbeLeavesNothing(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		without []string // none: every command allowed
		ok      bool
	}{{nil, true}, {[]string{"multi"}, false}, {[]string{"exec"}, false}, {[]string{"pexpireat"}, false}, {[]string{"incrby"}, false},
		{[]string{"time"}, false}, {[]string{"multi", "pexpireat"}, false}, {[]string{"multi", "exec"}, false}} {
		t.Run(fmt.Sprint("without ", tc.without), func(t *testing.T) {
			acl := []string{"ACL", "SETUSER", "probe", "reset", "on", ">secret", "~*", "+@all"}
			for _, cmd := range tc.without {
				acl = append(acl, "-"+cmd)
			}
			if _, err := srv.Do(acl...); err != nil {
				t.Fatal(err)
			}
			c, err := NewClient(ClientOptions{URL: srv.Addr, Type: "single", Auth: "probe:secret", PoolSize: 2, Timeout: testTimeout})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ok, known := plainProbe(context.Background(), c)
			if ok != tc.ok || !known {
				t.Errorf("plainProbe = %v, %v; want %v, known", ok, known, tc.ok)
			}
			if n, err := srv.Do("DBSIZE"); err != nil || strings.TrimSpace(n) != "0" {
				t.Errorf("after the probe, DBSIZE %q (%v); want 0: the probe left a key", n, err)
			}
		})
	}
}

// An ACL that takes MULTI away from a running service's user: the
// commands after the refused MULTI run on their own, and the decisions
// are taken again by the function rather than failed, plain and scripted
// ones sent in one transaction alike.
func TestPlainMultiTakenAwayAtRunTime(t *testing.T) {
	srv := redistest.Start(t)
	if _, err := srv.Do("ACL", "SETUSER", "svc", "reset", "on", ">secret", "~*", "+@all"); err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ClientOptions{URL: srv.Addr, Type: "single", Auth: "svc:secret", PoolSize: 4, Timeout: testTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c, Options{Batch: true})
	plainReady(t, s)
	fixed := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 1000, Period: 24 * time.Hour, CountRejected: true}
	sliding := limiter.Rule{Algorithm: limiter.SlidingWindow, Limit: 1000, Period: 24 * time.Hour, CountRejected: true}
	hit := func(rule limiter.Rule, key string) error {
		_, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: key, Rule: rule, Cost: 1}}})
		return err
	}
	if err := hit(fixed, "{acl}:k"); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("ACL", "SETUSER", "svc", "-multi"); err != nil {
		t.Fatal(err)
	}
	// Plain hits and the function's at once: the batcher sends them in
	// one transaction.
	var failed atomic.Int64
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			for range 10 {
				rule, key := fixed, "{acl}:k"
				if i%2 == 1 {
					rule, key = sliding, "{acl}:s"
				}
				if err := hit(rule, key); err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of 200 decisions failed after MULTI was taken away", n)
	}
	if !s.plainOff.Load() {
		t.Error("the plain path still serves after MULTI was refused")
	}
}
