package redis

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// Which decisions take the plain path (INCRBY and PEXPIREAT per hit in a
// transaction with a TIME, no function) and which the function, counted by
// Redis itself, on Redis's clock as the service sends them (no Now),
// batched and not.
func TestPlainPathTakesTheDefaultFixedWindow(t *testing.T) {
	count := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 100, Period: time.Hour, CountRejected: true}
	drop := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 100, Period: time.Hour}
	sliding := limiter.Rule{Algorithm: limiter.SlidingWindow, Limit: 100, Period: time.Hour, CountRejected: true}
	leased := count
	leased.Lease = "hot" // the store here leases nothing: no slice is asked for
	for _, tc := range []struct {
		name      string
		batch     limiter.Batch
		wantPlain bool
	}{
		{"count-rejected fixed window", limiter.Batch{Hits: []limiter.Hit{{Key: "{p}:a", Rule: count, Cost: 1}}}, true},
		{"two count-rejected hits", limiter.Batch{Hits: []limiter.Hit{{Key: "{p}:a", Rule: count, Cost: 1}, {Key: "{p}:b", Rule: count, Cost: 2}}}, true},
		{"advisory", limiter.Batch{Hits: []limiter.Hit{{Key: "{p}:a", Rule: count, Cost: 1, Advisory: true}}}, true},
		{"one hit, all or nothing", limiter.Batch{AllOrNothing: true, Hits: []limiter.Hit{{Key: "{p}:a", Rule: count, Cost: 1}}}, true},
		{"rejected hits dropped", limiter.Batch{Hits: []limiter.Hit{{Key: "{p}:d", Rule: drop, Cost: 1}}}, false},
		{"a check (cost 0)", limiter.Batch{Hits: []limiter.Hit{{Key: "{p}:a", Rule: count}}}, false},
		{"a refund", limiter.Batch{Hits: []limiter.Hit{{Key: "{p}:a", Rule: count, Cost: 1, Refund: true}}}, false},
		{"a leased rule", limiter.Batch{Hits: []limiter.Hit{{Key: "{p}:l", Rule: leased, Cost: 1}}}, false},
		{"another algorithm beside", limiter.Batch{Hits: []limiter.Hit{{Key: "{p}:a", Rule: count, Cost: 1}, {Key: "{p}:s", Rule: sliding, Cost: 1}}}, false},
		{"two hits, all or nothing", limiter.Batch{AllOrNothing: true, Hits: []limiter.Hit{{Key: "{p}:a", Rule: count, Cost: 1}, {Key: "{p}:b", Rule: count, Cost: 1}}}, false},
		{"a dry run", limiter.Batch{DryRun: true, Hits: []limiter.Hit{{Key: "{p}:a", Rule: count, Cost: 1}}}, false},
		{"a caller's clock", limiter.Batch{Now: time.Now(), Hits: []limiter.Hit{{Key: "{p}:a", Rule: count, Cost: 1}}}, false},
		{"a cost past the largest count", limiter.Batch{Hits: []limiter.Hit{{Key: "{p}:a", Rule: count, Cost: limiter.MaxCount + 1}}}, false},
	} {
		for _, batched := range []bool{false, true} {
			t.Run(tc.name+"/batched="+strconv.FormatBool(batched), func(t *testing.T) {
				srv := redistest.Start(t)
				s := newStore(t, single(t, srv), Options{Batch: batched})
				plainReady(t, s)
				if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
					t.Fatal(err)
				}
				if _, err := s.Apply(context.Background(), tc.batch); err != nil {
					t.Fatal(err)
				}
				st, err := srv.CommandStats()
				if err != nil {
					t.Fatal(err)
				}
				calls, _ := redistest.ScriptCalls(st)
				n := len(tc.batch.Hits)
				plain := calls == 0 && st["incrby"].Calls == n && st["pexpireat"].Calls == n && st["exec"].Calls == 1 && st["time"].Calls == 1
				if plain != tc.wantPlain {
					t.Errorf("plain = %v (script calls %d, INCRBY %d, PEXPIREAT %d, EXEC %d, TIME %d), want %v", plain, calls,
						st["incrby"].Calls, st["pexpireat"].Calls, st["exec"].Calls, st["time"].Calls, tc.wantPlain)
				}
			})
		}
	}
}

// plainReady waits until s may take the plain path: Redis's clock is
// known and the permission probe has passed (the ACL test waits for its
// refusal instead).
func plainReady(t *testing.T, s *Store) {
	t.Helper()
	knowsRedisClock(t, s.rclock)
	for deadline := time.Now().Add(30 * time.Second); !s.plainAllowed(); time.Sleep(20 * time.Millisecond) {
		if s.plainOff.Load() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the plain path's permission probe did not pass within 30 s")
		}
	}
}

// knowsRedisClock waits until rc has kept a reading of Redis's clock: on
// a busy machine a TIME can take longer than clockMaxRTT, and a first
// reading that failed is tried again a second later.
func knowsRedisClock(t *testing.T, rc *redisClock) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, ok := rc.now(context.Background()); ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no reading of Redis's clock kept within 30 s")
		}
	}
}

// The estimate of Redis's clock lies between two TIME readings taken
// around it (with a round trip's room either side).
func TestRedisClockEstimate(t *testing.T) {
	srv := redistest.Start(t)
	c := single(t, srv)
	rc := &redisClock{client: c}
	ctx := context.Background()
	knowsRedisClock(t, rc)
	for range 3 {
		before, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		est, ok := rc.now(ctx)
		if !ok {
			t.Fatal("no estimate of Redis's clock")
		}
		after, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if lo, hi := before.UnixMicro()-clockMaxRTT.Microseconds(), after.UnixMicro()+clockMaxRTT.Microseconds(); est < lo || est > hi {
			t.Errorf("estimate %d µs, want within [%d, %d] (TIME before and after, a round trip's room)", est, lo, hi)
		}
	}
}

// A reading older than clockEvery is taken again in the background, and
// meanwhile the old one serves: a reading an hour off is replaced.
func TestRedisClockReadsAgain(t *testing.T) {
	srv := redistest.Start(t)
	c := single(t, srv)
	rc := &redisClock{client: c}
	ctx := context.Background()
	stale := time.Now().Add(-clockEvery - time.Second)
	off := time.Now().Add(time.Hour).UnixMicro()
	rc.reading.Store(&clockReading{redis: off, local: stale})
	if est, ok := rc.now(ctx); !ok || est < off {
		t.Fatalf("estimate %d, %v: want the old reading's while the new one is taken", est, ok)
	}
	// Each call past clockEvery tries again once the last try is done (a
	// TIME slower than clockMaxRTT on a busy machine is not kept).
	for deadline := time.Now().Add(30 * time.Second); rc.reading.Load().local == stale; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stale reading was not taken again")
		}
		rc.now(ctx)
	}
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	est, _ := rc.now(ctx)
	if d := time.Duration(est-now.UnixMicro()) * time.Microsecond; d < -clockMaxRTT || d > clockMaxRTT {
		t.Errorf("estimate after the new reading is %v off Redis's TIME", d)
	}
}

// Until Redis's clock has been read, a decision the plain path could take
// takes the function: here no Redis answers TIME, and the call is the
// function's.
func TestPlainNeedsRedisClock(t *testing.T) {
	srv := redistest.Start(t)
	c := single(t, srv)
	srv.Stop()
	s, err := New(c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 10, Period: time.Hour, CountRejected: true}
	g := &group{idx: []int{0}, keys: []string{keyVersion + "{c}:k"}, hits: []*limiter.Hit{{Key: "{c}:k", Rule: r, Cost: 1}}}
	if got := s.route(context.Background(), redisTime, modeEach, g, true); !isScript(got.route) {
		t.Errorf("call without Redis's clock = %+v, want the function's", got)
	}
	if _, ok := s.rclock.now(context.Background()); ok {
		t.Error("an estimate of the clock of a Redis that does not answer")
	}
}

// isScript reports whether rt is batch.lua's route.
func isScript(rt route) bool {
	_, ok := rt.(*scriptRoute)
	return ok
}
