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
// needs nothing of batch.lua that plain commands cannot do: the count goes
// up whatever the answer, and the answer is the count against the limit.
// So such a decision is sent as two commands per hit, INCRBY of its
// window's key (win_key in state.lua: KEY|w) and PEXPIREAT of that key at
// the window's end with NX, in one MULTI/EXEC with a TIME. Redis spends
// about half the CPU on it that the function does (docs/performance.md).
//
// The PEXPIREAT goes with every INCRBY, even on a key the process has seen
// exist: a transaction may run long after its caller gave up on it (Redis
// stalled past REDIS_TIMEOUT by a busy script, DEBUG SLEEP, a paused
// process), when its window's key has expired, and an INCRBY alone would
// then make the key again without a TTL, for good. With its PEXPIREAT, a
// late hit's key gets the window's end, which has passed: it is deleted at
// once (TestNoKeyWithoutATTLAfterAStall). An earlier version sent the
// INCRBY alone on known keys and mended a key the reply showed new; a
// reply that never arrives mends nothing.
//
// One writer, one lifecycle. The function and this path write the same
// keys the same way: a window's count is its own key, which gets its TTL
// (the window's end) in the transaction that creates it and is never
// dropped or shortened by anyone. So no writer can undo another's count,
// and no key is without its TTL, whatever moment a process dies or Redis
// runs a transaction (nothing of a transaction runs before its EXEC, and
// all of it runs at once).
//
// One clock. The function picks a hit's window by Redis's TIME. This path
// must pick it before it sends, so it uses an estimate of Redis's clock
// (redisClock), and then checks it by the TIME read in the same
// transaction, at the instant the counts were made: a hit whose window is
// not the one TIME falls in (an estimate behind or ahead, a Redis stalled
// past an edge, a clock that jumped, a transaction that straddled an edge
// cannot happen, EXEC runs at one instant) is not answered from its count.
// It is decided again by the function, on Redis's clock, in a second round
// trip, and the estimate is read again. What the discarded count did: in a
// window that had ended, its key is deleted by its own PEXPIREAT (a time
// in the past), so it counts nowhere; in a window still to come, it counts
// there, which can only reject sooner, never admit more. So every answer
// is what the function would have answered at that instant: no window
// ever counts past its limit, whichever path its hits took.
//
// Where the plain path does not serve, the function does, exactly as
// before: on Redis Cluster (a TIME must run on the node of the keys it
// dates, in the transaction that counts them, and a transaction may not
// span slots: a transaction per hit's slot, tried, cost Redis more than
// the function, docs/performance.md), with a caller's clock (Batch.Now),
// until the function library has loaded (PEXPIREAT ... NX needs Redis 7),
// Redis's clock is known and the permission probe has passed
// (plainAllowed), and once Redis refused one of its commands (an ACL
// without INCRBY, PEXPIREAT, MULTI, EXEC or TIME).

// clockEvery is how old a reading of Redis's clock may grow before it is
// taken again (in the background; the old one serves meanwhile).
const clockEvery = 5 * time.Second

// clockMaxRTT is the longest round trip a reading of Redis's clock may
// take to be kept: a slower one says too little of when TIME ran. (An
// estimate that is off only sends more hits to the function: see above.)
const clockMaxRTT = 100 * time.Millisecond

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

// stale makes the next estimate take a new reading (in the background,
// the current one serving meanwhile): a plain call found its estimate off.
func (c *redisClock) stale() {
	r := c.reading.Load()
	if r == nil || time.Since(r.local) > clockEvery {
		return
	}
	back := clockEvery + time.Second
	c.reading.CompareAndSwap(r, &clockReading{redis: r.redis - back.Microseconds(), local: r.local.Add(-back)})
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
// commands: every hit a fixed window that counts rejected hits, with a
// cost of at most limiter.MaxCount (a count past it is set back after,
// sendRepairs), no refund or overdraft, and a rule without a lease (even
// when no slice is asked for: its key's slices are the code's to account,
// and a plain count beside them let two replicas admit the limit twice,
// found by TestLeaseThroughTheBinary); each hit on its own (mode 0, or one
// hit, which is all or nothing by itself).
func plainEligible(mode scriptMode, g *group) bool {
	if g.wants != nil || mode != modeEach && !(mode == modeAllOrNothing && len(g.hits) == 1) {
		return false
	}
	for _, h := range g.hits {
		r := &h.Rule
		if r.Algorithm != limiter.FixedWindow || !r.CountRejected || r.Overdraft || r.Lease != "" || h.Refund || h.Cost == 0 ||
			h.Cost > limiter.MaxCount || r.Period < time.Microsecond {
			return false
		}
	}
	return true
}

// plainAllowed reports whether the permission probe (plainProbe) has
// found the plain path's commands allowed; until it knows, it runs the
// probe in the background (at most once per probeEvery) and the function
// serves. A refusal turns the plain path off for good.
func (s *Store) plainAllowed() bool {
	if s.plainOK.Load() {
		return true
	}
	if !s.probeMu.TryLock() {
		return false
	}
	if time.Since(s.lastProbe) < probeEvery {
		s.probeMu.Unlock()
		return false
	}
	s.lastProbe = time.Now()
	go func() {
		defer s.probeMu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		switch ok, known := plainProbe(ctx, s.client); {
		case ok:
			s.plainOK.Store(true)
		case known:
			s.plainOff.Store(true)
		}
	}()
	return false
}

// windowKey is key's count of window w: batch.lua's win_key.
func windowKey(key string, w int64) string {
	return key + "|" + strconv.FormatInt(w, 10)
}

// plainRoute is a decision's hits as plain commands: INCRBY wkeys[i] by
// costs[i], each key expiring at expireAt[i] (PEXPIREAT ... NX), in the
// round trip's transaction, whose TIME dates the counts.
type plainRoute struct {
	wkeys    []string
	costs    []int64
	windows  []int64 // each hit's window number, by the estimate of Redis's clock
	expireAt []int64 // ms since the Unix epoch: when each hit's window ends
	incrs    []*goredis.IntCmd
	// Once sent: each hit's count after it, and Redis's TIME (µs) in
	// the transaction that made them; or why not.
	counts []int64
	at     int64
	err    error
}

// init makes p g's plain route, its windows picked by est, an estimate of
// Redis's clock (µs), each key's TTL jitter ms past its window's end.
func (p *plainRoute) init(g *group, est, jitter int64) {
	n := len(g.hits)
	p.wkeys, p.costs, p.windows, p.expireAt = make([]string, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, h := range g.hits {
		w, end := limiter.FixedWindowAt(time.UnixMicro(est), h.Rule)
		p.wkeys[i] = windowKey(g.keys[i], w)
		p.costs[i] = int64(h.Cost)
		p.windows[i] = w
		p.expireAt[i] = (end.UnixMicro()+999)/1000 + jitter // as batch.lua's ttl_ms, rounded up
	}
}

func (p *plainRoute) transactional() bool     { return true }
func (p *plainRoute) scripts() []*scriptRoute { return nil }
func (p *plainRoute) failure() error          { return p.err }

// refusedForGood: see plainRefused.
func (p *plainRoute) refusedForGood(err error) bool { return plainRefused(err) }

// queue queues, per hit, INCRBY of its window's key and PEXPIREAT of it
// at the window's end, NX (a key that has its TTL keeps it; see above for
// why it is never left out).
func (p *plainRoute) queue(ctx context.Context, pl goredis.Pipeliner, _ bool) {
	p.incrs = make([]*goredis.IntCmd, len(p.wkeys))
	for j, k := range p.wkeys {
		p.incrs[j] = pl.IncrBy(ctx, k, p.costs[j])
		pl.Do(ctx, "PEXPIREAT", k, p.expireAt[j], "NX")
	}
}

// read takes the counts and the transaction's TIME (or its error). A
// command Redis refused as it was queued (an ACL) fails the transaction
// (EXECABORT): its own error says why.
func (p *plainRoute) read(_ context.Context, _ goredis.UniversalClient, _ bool, t *trip) {
	if t.at == nil {
		p.err = fmt.Errorf("redis: plain commands sent outside a transaction")
		return
	}
	at, err := t.at.Result()
	p.err = err
	for _, cmd := range p.incrs {
		if err := cmd.Err(); plainRefused(err) {
			p.err = err
		}
	}
	if p.err != nil {
		return
	}
	p.counts = make([]int64, len(p.incrs))
	for j, cmd := range p.incrs {
		if p.counts[j], p.err = cmd.Result(); p.err != nil {
			return
		}
	}
	p.at = at.UnixMicro()
}

// sendAlone: a plain route is never sent outside a transaction, which
// roundTrip makes for it (with its TIME).
func (p *plainRoute) sendAlone(ctx context.Context, client goredis.UniversalClient, fn bool) {
	roundTrip(ctx, client, fn, []route{p})
}

// answer answers g's hits from the counts as fixed_count does in
// batch.lua, each where its window is the one Redis's TIME fell in when
// they were counted; it returns the hits (as a group) that are not, to be
// decided by the function, or nil. It adds to repairs the counts it took
// past limiter.MaxCount.
func (p *plainRoute) answer(g *group, outs []limiter.Outcome, repairs *[]repair) (*group, error) {
	if len(p.counts) != len(g.hits) {
		return nil, fmt.Errorf("redis: %d counts for %d plain hits", len(p.counts), len(g.hits))
	}
	var again *group
	for j, h := range g.hits {
		if p.counts[j] > limiter.MaxCount {
			*repairs = append(*repairs, repair{key: p.wkeys[j]})
		}
		if w, _ := limiter.FixedWindowAt(time.UnixMicro(p.at), h.Rule); w != p.windows[j] {
			if again == nil {
				again = &group{}
			}
			again.idx, again.keys, again.hits = append(again.idx, g.idx[j]), append(again.keys, g.keys[j]), append(again.hits, h)
			continue
		}
		// The count before this hit decides it, by the arithmetic every
		// Go store shares (limiter's fixed step).
		before := uint64(min(max(p.counts[j]-p.costs[j], 0), limiter.MaxCount))
		_, outs[g.idx[j]], _ = limiter.EvalFixed(before, time.UnixMicro(p.at), h.Rule, h.Cost, false)
	}
	return again, nil
}

// repair is what a plain call's counts left to mend, in the background
// after the answer: a count it took past limiter.MaxCount.
type repair struct {
	key string
}

// repairTimeout bounds the background call that mends them.
const repairTimeout = 5 * time.Second

// sendRepairs mends them in one pipeline, in the background: a count past
// limiter.MaxCount is set back to it, as batch.lua's
// fixed_count does (SET ... XX KEEPTTL: a key that expired meanwhile is
// not made again). Without that, hits of the largest cost would take a
// shared key to INCRBY's overflow, and every decision on it would fail
// until its window ended.
func sendRepairs(client goredis.UniversalClient, repairs []repair) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), repairTimeout)
		defer cancel()
		_, _ = client.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for _, r := range repairs {
				p.Do(ctx, "SET", r.key, limiter.MaxCount, "XX", "KEEPTTL")
			}
			return nil
		})
	}()
}
