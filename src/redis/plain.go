package redis

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/openrls/ratelimit/src/limiter"
)

// The plain fixed-window path.
//
// The common decision, a fixed window that counts the hits it rejects
// (REJECTED_HITS=count, the default) with no lease, refund or overdraft,
// needs nothing of batch.lua that a plain HINCRBY cannot do: the count goes
// up whatever the answer, and the answer is the count against the limit.
// So such a decision is sent as one HINCRBY per hit, pipelined with the
// batch, not as part of a function call: Redis spends about half the CPU on
// it (docs/performance.md, BenchmarkDecisionParts). The state is the
// function's, the same hash field per window, so both paths (and replicas
// of either version) count the same counters.
//
// What the function did besides, the plain path does so:
//   - Redis's clock picks the window. The store keeps its offset to Redis's
//     TIME (redisClock); until it knows it, decisions take the function. A
//     window is then picked by Redis's clock as estimated when the decision
//     is sent, not as read when it runs: the two differ by about a round
//     trip, which only moves hits near a window's edge into one window or
//     the other; no window ever counts past its limit.
//   - A window's first count (the count equals the cost) sets the key's TTL
//     and drops the field of the window before the previous one, in a second
//     round trip for that decision alone, before it is answered. The TTL has
//     plainTTLSlack more than the function's, for the clock's estimate, and
//     is only ever lengthened (PEXPIRE NX, then GT). The previous window's
//     field stays: another replica, whose estimate is a little behind, may
//     still count a hit it stamped just before the edge, and that hit must
//     meet its window's true count, and must not cut the key's TTL back to
//     its window's end (both found by TestPlainLateHitAcrossAnEdge). A
//     process killed between the two round trips leaves that key without a
//     TTL until its next window's first count.
//   - A count past limiter.MaxCount is set back to it, in the same second
//     round trip.

// plainTTLSlack is added to a plain window key's TTL: the estimate of
// Redis's clock may be behind by up to a round trip of the TIME that made
// it, and a key must not expire before its window ends.
const plainTTLSlack = time.Second

// clockEvery is how old a reading of Redis's clock may grow before it is
// taken again (in the background; the old one serves meanwhile).
const clockEvery = 5 * time.Second

// followUpTimeout bounds the follow-ups of a store without a timeout
// (REDIS_TIMEOUT 0).
const followUpTimeout = time.Second

// clockMaxRTT is the longest round trip a reading of Redis's clock may
// take to be kept: a slower one says too little of when TIME ran. (A
// reading is off by at most half its round trip; plainTTLSlack covers
// that many times over.)
const clockMaxRTT = 100 * time.Millisecond

// plainCall is a call of HINCRBYs: keys[i] (the call's) field fields[i] by
// costs[i]. Its reply is the counts, an []int64.
type plainCall struct {
	fields []string
	costs  []int64
	now    int64 // µs: the instant the windows are of (the batch's, or Redis's clock as estimated)
	// ttlNow is the instant TTLs are measured from: now, or Redis's clock
	// when now is ahead of it (a reservation for a coming window), so that
	// a key lives until its window ends by Redis's clock (as batch.lua's
	// ttl_now).
	ttlNow int64
}

// redisClock estimates Redis's clock: a TIME reading and the local
// monotonic instant half way through its round trip.
type redisClock struct {
	client  goredis.UniversalClient
	reading atomic.Pointer[clockReading] // nil until a reading was kept
	mu      sync.Mutex                   // held by the one goroutine taking a reading
	tried   time.Time                    // the last first reading tried; guarded by mu
}

type clockReading struct {
	redis int64     // µs since the Unix epoch, by Redis's clock
	local time.Time // when, locally (monotonic)
}

// now is Redis's clock, in µs, as estimated now; ok is false until a
// reading was kept. A reading older than clockEvery is taken again: at once
// when there is none (the caller waits, once per process; after a failure,
// at most once a second, so that a Redis that does not answer is not asked
// twice per decision), else in the background.
func (c *redisClock) now(ctx context.Context) (int64, bool) {
	r := c.reading.Load()
	switch {
	case r == nil:
		if !c.mu.TryLock() {
			return 0, false // another decision is reading it: the function serves
		}
		if time.Since(c.tried) >= time.Second {
			c.tried = time.Now()
			c.read(ctx)
		}
		c.mu.Unlock()
		if r = c.reading.Load(); r == nil {
			return 0, false
		}
	case time.Since(r.local) > clockEvery && c.mu.TryLock():
		go func() {
			defer c.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			c.read(ctx)
		}()
	}
	return r.redis + time.Since(r.local).Microseconds(), true
}

// read takes a reading of Redis's clock; one whose round trip took longer
// than clockMaxRTT (or failed) is not kept.
func (c *redisClock) read(ctx context.Context) {
	before := time.Now()
	t, err := c.client.Time(ctx).Result()
	rtt := time.Since(before)
	if err != nil || rtt > clockMaxRTT {
		return
	}
	c.reading.Store(&clockReading{redis: t.UnixMicro(), local: before.Add(rtt / 2)})
}

// plainEligible reports whether g, in mode, can be decided by plain
// HINCRBYs: every hit a fixed window that counts rejected hits, with a
// cost, no refund or overdraft, and a rule without a lease (even when no
// slice is asked for: its key's slices are the code's to account, and a
// plain count beside them let two replicas admit the limit twice, found by
// TestLeaseThroughTheBinary); each hit on its own (mode 0, or one hit,
// which is all or nothing by itself).
func plainEligible(mode scriptMode, g *group) bool {
	if g.wants != nil || mode != modeEach && !(mode == modeAllOrNothing && len(g.hits) == 1) {
		return false
	}
	for _, h := range g.hits {
		r := &h.Rule
		if r.Algorithm != limiter.FixedWindow || !r.CountRejected || r.Overdraft || r.Lease != "" || h.Refund || h.Cost == 0 ||
			r.Period < time.Microsecond {
			return false
		}
	}
	return true
}

// newCall is g's call: plain HINCRBYs when g is eligible, the function
// library is loaded and Redis's clock is known (the windows are then now's,
// or by that clock when now is redisTime), else the function's.
func (s *Store) newCall(ctx context.Context, now int64, mode scriptMode, g *group) *call {
	// The follow-ups need Redis 7 (PEXPIRE NX and GT): a loaded function
	// library says so.
	if plainEligible(mode, g) && s.runner.ready.Load() {
		if est, ok := s.rclock.now(ctx); ok {
			at := now
			if now == redisTime {
				at = est
			}
			p := &plainCall{now: at, ttlNow: min(at, est), fields: make([]string, len(g.hits)), costs: make([]int64, len(g.hits))}
			for i, h := range g.hits {
				w := at / int64(h.Rule.Period/time.Microsecond)
				p.fields[i] = strconv.FormatInt(w, 10)
				p.costs[i] = int64(min(h.Cost, 1<<53)) // as scriptArg clamps it
			}
			return &call{keys: g.keys, plain: p}
		}
	}
	return &call{keys: g.keys, arg: scriptArg(now, mode, g.hits, g.wants)}
}

// plainOutcomes answers g's hits from their counts as fixed_count does in
// batch.lua, and adds to f what a window's first count or a count past
// limiter.MaxCount must still do.
func plainOutcomes(c *call, counts []int64, g *group, outs []limiter.Outcome, f *followUps) error {
	p := c.plain
	if len(counts) != len(g.hits) {
		return fmt.Errorf("redis: %d counts for %d hits", len(counts), len(g.hits))
	}
	for j, h := range g.hits {
		period := int64(h.Rule.Period / time.Microsecond)
		w := p.now / period
		end := (w + 1) * period
		reset := time.Duration(end-p.now) * time.Microsecond
		n := counts[j]
		if n == p.costs[j] {
			f.newWindow(c.keys[j], w, end, p.ttlNow)
		}
		if n > limiter.MaxCount {
			f.clamp(c.keys[j], p.fields[j])
			n = limiter.MaxCount
		}
		o := limiter.Outcome{ResetAfter: reset}
		if limit := int64(min(h.Rule.Limit, 1<<62)); n <= limit {
			o.Allowed, o.Remaining = true, uint64(limit-n)
		} else {
			o.RetryAfter = reset
		}
		outs[g.idx[j]] = o
	}
	return nil
}

// followUps is what plain decisions' counts left to do, sent in one
// pipeline before they are answered.
type followUps struct {
	windows []newWindow
	clamps  [][2]string // key, field
}

// newWindow is window w's first count on key: the key lives at least
// until the window ends (plus plainTTLSlack), and the field of the window
// before the previous one goes.
type newWindow struct {
	key string
	old string // the field of window w-2
	ttl time.Duration
}

// newWindow records window w's first count on key, the window ending at
// end µs, its TTL measured from now µs.
func (f *followUps) newWindow(key string, w, end, now int64) {
	f.windows = append(f.windows, newWindow{key: key, old: strconv.FormatInt(w-2, 10),
		ttl: time.Duration(end-now)*time.Microsecond + plainTTLSlack})
}

// clamp records key's field to set back to limiter.MaxCount.
func (f *followUps) clamp(key, field string) {
	f.clamps = append(f.clamps, [2]string{key, field})
}

// send runs the follow-ups in one round trip, by deadline (zero: within
// followUpTimeout). A caller that went away does not stop them: the counts
// are made, and a key must not be left without its TTL.
func (f *followUps) send(ctx context.Context, deadline time.Time, client goredis.UniversalClient) error {
	if len(f.windows)+len(f.clamps) == 0 {
		return nil
	}
	if deadline.IsZero() {
		deadline = time.Now().Add(followUpTimeout)
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	_, err := client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for _, w := range f.windows {
			// NX sets a new key's TTL, GT lengthens an existing one;
			// neither shortens it (a late hit of an earlier window).
			ms := w.ttl.Milliseconds()
			p.Do(ctx, "PEXPIRE", w.key, ms, "NX")
			p.Do(ctx, "PEXPIRE", w.key, ms, "GT")
			p.HDel(ctx, w.key, w.old)
		}
		for _, c := range f.clamps {
			p.HSet(ctx, c[0], c[1], strconv.FormatInt(limiter.MaxCount, 10))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redis: after counting, set %d new windows' TTLs: %w", len(f.windows), err)
	}
	return nil
}
