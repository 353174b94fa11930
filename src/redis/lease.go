package redis

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

// Leased budgets
//
// A hot key (one limit for a whole API, a tenant, a provider) sends every
// request of every replica to one Redis key, on one shard. For a rule with
// a lease (limiter.Rule.Lease), a replica instead takes a slice of the
// window's remaining budget in the script call that decides a hit: Redis
// counts the slice at once, as hits of the current window, and the replica
// admits from it locally until it is spent, then asks again.
//
// Exact: every hit a slice admits was counted in Redis, in the window in
// which it is admitted, before anyone else was told what remains, so no
// window counts, or admits, past its limit on any number of replicas. A
// slice admits only until its window's end as seen from before the call
// that took it (the call's start plus the reset Redis answered), which is
// never later than the window's end in Redis, whatever the offset between
// the clocks (the replica's monotonic clock measures the time). Hits a
// slice does not spend were counted and are lost to that window: what
// leasing gives up is liveness at the limit, not safety.
//
// Sizing: a slice covers the replica's own recent rate on the key for
// Interval (or until the window ends, if sooner); Redis caps it at half of
// what remains, so that near the limit slices shrink to nothing and the
// last hits are decided in Redis one by one.
//
// Given back: what a slice holds goes back when a hit does not fit in it
// (before Redis decides that hit, so that one replica decides exactly as
// without leases), before a refund, when its rule changes (a reload), when
// unused for Idle, and at Close: as a refund naming the slice's window,
// which Redis applies only while that window still counts on the key (see
// batch.lua's lease_return). A slice lost with its replica stays counted,
// never twice.

// leases holds this replica's slices, one per leased key.
type leases struct {
	slices   sync.Map // limiter.Hit.Key -> *leaseSlice
	count    atomic.Int64
	interval time.Duration
	idle     time.Duration
	clock    func() time.Time

	mu      sync.Mutex
	returns []sliceReturn // slices to give back at the next sweep
	stats   map[string]*leaseStats
}

// leaseStats are one rule's lease counters.
type leaseStats struct {
	taken, leased, returned atomic.Uint64
}

// sliceReturn is a slice to give back: n unspent hits of window under rule, of
// a slice of size hits in all, which Redis then stops holding against
// refunds (see batch.lua's held hits).
type sliceReturn struct {
	key     string
	rule    limiter.Rule
	window  int64
	n, size uint64
	gen     int64 // the generation of Redis's record that granted it
}

// leaseSlice is a replica's budget on one key.
type leaseSlice struct {
	mu sync.Mutex
	sliceFields
}

// sliceFields are a leaseSlice's fields, guarded by its mu.
type sliceFields struct {
	rule limiter.Rule
	// left hits of the slice are not yet admitted; they were counted in
	// Redis's window number window, and may be admitted before until.
	left   uint64
	window int64
	until  time.Time
	// gen is the generation of Redis's record of the key's slices that
	// granted this one (see batch.lua's held hits).
	gen int64
	// size is what the slice was granted in all: Redis holds it against
	// refunds until the slice goes back. returns counts the give-backs:
	// hits taken before one can no longer be put back (see putBack).
	size, returns uint64
	// remaining is what Redis said remains beyond every slice it granted,
	// as of its last answer; reset is when the window's count empties.
	remaining uint64
	reset     time.Time
	// taking is set while a call that may grant a slice is in flight: one
	// at a time, so concurrent misses do not each take a slice.
	taking bool
	// seen counts the hits on this key since since, the start of the last
	// call that could grant: the replica's recent rate.
	seen    uint64
	since   time.Time
	lastUse time.Time
}

// LeaseStats is one rule's lease activity: slices taken, the hits they
// held, hits given back, and hits held now (taken, not yet admitted,
// window not over).
type LeaseStats struct {
	Slices, Leased, Returned, Held uint64
}

func newLeases(interval, idle time.Duration, clock func() time.Time) *leases {
	return &leases{interval: interval, idle: idle, clock: clock, stats: map[string]*leaseStats{}}
}

// leased reports whether b has a hit on a leased rule.
func leased(b limiter.Batch) bool {
	for i := range b.Hits {
		if b.Hits[i].Rule.Lease != "" {
			return true
		}
	}
	return false
}

// maxSlices bounds how many keys hold lease state at once. A lease pays
// on hot keys; a leased rule with many values (a client per key) has few
// hot ones, and a client sending new values must not grow this without
// bound: past it, new keys are decided in Redis hit by hit until idle
// keys are forgotten (after Idle).
const maxSlices = 1 << 16

// get returns key's slice, or nil when maxSlices keys hold one.
func (l *leases) get(h *limiter.Hit, now time.Time) *leaseSlice {
	if v, ok := l.slices.Load(h.Key); ok {
		return v.(*leaseSlice)
	}
	if l.count.Load() >= maxSlices {
		return nil
	}
	v, loaded := l.slices.LoadOrStore(h.Key, &leaseSlice{sliceFields: sliceFields{rule: h.Rule, lastUse: now}})
	if !loaded {
		l.count.Add(1)
	}
	return v.(*leaseSlice)
}

func (l *leases) ruleStats(name string) *leaseStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.stats[name]
	if st == nil {
		st = &leaseStats{}
		l.stats[name] = st
	}
	return st
}

// returnable reports whether giving sl back changes anything (sl.mu
// held): it holds unspent hits, or Redis holds its grant against refunds;
// while its window lasts, and for a sliding window during the next one, on
// which it still weighs.
func (sl *leaseSlice) returnable(now time.Time) bool {
	return (sl.left > 0 || sl.size > 0) && now.Before(sl.until.Add(slack(sl.rule)))
}

// back is sl given back (sl.mu held).
func (sl *leaseSlice) back(key string) sliceReturn {
	return sliceReturn{key: key, rule: sl.rule, window: sl.window, n: sl.left, size: sl.size, gen: sl.gen}
}

// queue schedules sl's unspent hits for return (sl.mu held).
func (l *leases) queue(key string, sl *leaseSlice, now time.Time) {
	if sl.returnable(now) {
		l.mu.Lock()
		l.returns = append(l.returns, sl.back(key))
		l.mu.Unlock()
	}
	sl.left, sl.size = 0, 0
	sl.returns++
}

// leaseUse is what a leased hit did with its slice.
type leaseUse struct {
	sl *leaseSlice
	// local is set when its slice answered it, taking its cost from the
	// slice of window (put back if the batch counts nothing).
	local  bool
	took   uint64
	window int64
	// returns is the slice's count of give-backs when it answered.
	returns uint64
	// want is the lease parameter of its call to Redis: the slice it asks
	// for.
	want uint64
	// base is what Redis last said remains beyond the slices.
	base uint64
	// back is what goes back to Redis before the batch (n or size > 0).
	back sliceReturn
}

// admit answers h from sl when the slice holds its whole cost, and takes
// it. Otherwise the hit goes to Redis, and admit says what goes with it:
// what is left of the slice, to give back first, so that Redis decides on
// everything that remains (a refund is then clamped at what was admitted,
// and a sliding window's unspent hits stop weighing on the next window),
// and the slice to ask for (none while another call is taking one, or in
// a dry run). A dry run gives back too: giving a slice back is never part
// of what a batch decides, so it is never wrong to do.
func (l *leases) admit(key string, sl *leaseSlice, h *limiter.Hit, now time.Time, dryRun, mayTake bool) (out limiter.Outcome, u leaseUse) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	u.sl = sl
	if sl.rule != h.Rule {
		// The config changed under the slice (a reload): it goes back
		// before this hit is decided under the new rule.
		if sl.returnable(now) {
			u.back = sl.back(key)
		}
		sl.sliceFields = sliceFields{rule: h.Rule, lastUse: now, returns: sl.returns + 1}
	}
	if !dryRun {
		sl.seen += h.Cost
		sl.lastUse = now
	}
	if now.Before(sl.until) && !h.Refund && sl.left >= max(h.Cost, 1) {
		sl.left -= h.Cost
		u.local, u.took, u.window, u.base, u.returns = true, h.Cost, sl.window, sl.remaining, sl.returns
		return limiter.Outcome{Allowed: true, Remaining: sl.remaining + sl.left, ResetAfter: sl.reset.Sub(now)}, u
	}
	if sl.returnable(now) {
		u.back = sl.back(key)
	}
	sl.left, sl.size = 0, 0
	sl.returns++
	if !h.Refund && !dryRun && mayTake && !sl.taking {
		u.want = l.want(sl, now)
		sl.since, sl.seen = now, 0
		sl.taking = u.want > 0
	}
	return out, u
}

// want sizes a slice: the hits seen since the last call that could
// grant, scaled from the time they took to Interval, or to the window's
// end when that comes sooner. The time is taken as at least minRateSpan:
// hits of concurrent callers arrive microseconds apart, and a rate
// measured over such a gap is no rate. And a slice is at most a
// maxSliceShare-th of the limit, whatever the rate: it is what other
// replicas cannot spend while this one holds it, and what this one
// strands until the window ends if it dies holding it.
func (l *leases) want(sl *leaseSlice, now time.Time) uint64 {
	if sl.since.IsZero() {
		return 0 // no rate yet: the first hit only starts the clock
	}
	horizon := l.interval
	if left := sl.until.Sub(now); left > 0 && left < horizon {
		horizon = left // the window ends first; the next one starts afresh
	}
	elapsed := max(now.Sub(sl.since), minRateSpan)
	w := float64(sl.seen) * float64(horizon) / float64(elapsed)
	return uint64(min(w, float64(maxSlice(sl.rule.Limit))))
}

// minRateSpan and maxSliceShare bound a slice (see want).
const (
	minRateSpan   = time.Millisecond
	maxSliceShare = 16
)

// maxSlice is the largest slice of a limit: a maxSliceShare-th, at least 1.
func maxSlice(limit uint64) uint64 { return max(limit/maxSliceShare, 1) }

// slack is how long after a slice's window ends its count still matters:
// a sliding window's count weighs on the next window.
func slack(r limiter.Rule) time.Duration {
	if r.Algorithm == limiter.SlidingWindow {
		return r.Period
	}
	return 0
}

// putBack returns what u took from its slice after the batch counted
// nothing, unless the slice has moved to another window meanwhile (then
// those hits ended with theirs) or went back to Redis: Redis then no
// longer holds them for this replica, and admitting them again could
// pass the limit (after a restart they may be counted nowhere). They
// stay counted instead: never over the limit, at worst as many under.
func (u *leaseUse) putBack() {
	if u.sl == nil || u.took == 0 {
		return
	}
	u.sl.mu.Lock()
	if u.sl.window == u.window && u.sl.returns == u.returns {
		u.sl.left += u.took
	}
	u.sl.mu.Unlock()
}

// credit notes that n hits of sl went back to Redis, which now has them
// remaining.
func (sl *leaseSlice) credit(n uint64) {
	sl.mu.Lock()
	sl.remaining += n
	sl.mu.Unlock()
}

// view returns what Redis last said remains beyond the slices and what sl
// holds for its replica now.
func (sl *leaseSlice) view(now time.Time) (remaining, held uint64) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if now.Before(sl.until) {
		held = sl.left
	}
	return sl.remaining, held
}

// observe notes what Redis said remains on sl's key (beyond every
// slice), and returns what sl holds for its replica now: its unspent hits.
func (sl *leaseSlice) observe(out limiter.Outcome, now time.Time) uint64 {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if out.Allowed {
		sl.remaining = out.Remaining
	}
	if now.Before(sl.until) {
		return sl.left
	}
	return 0
}

// took records the answer to a call that could grant a slice on sl. sent
// is the local instant before the call: the answer's times are counted
// from it, so the slice ends no later than its window in Redis.
func (l *leases) took(key string, sl *leaseSlice, h *limiter.Hit, out limiter.Outcome, g grant, ok bool, sent time.Time) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	sl.taking = false
	if !ok {
		return
	}
	if sl.rule != h.Rule {
		// The rule changed while the call was out: the slice goes back.
		if g.extra > 0 {
			l.mu.Lock()
			l.returns = append(l.returns, sliceReturn{key: key, rule: h.Rule, window: g.window, n: g.extra, size: g.extra, gen: g.gen})
			l.mu.Unlock()
		}
		return
	}
	if !out.Allowed {
		return
	}
	sl.remaining = out.Remaining
	sl.reset = sent.Add(out.ResetAfter)
	if g.extra == 0 {
		return
	}
	st := l.ruleStats(h.Rule.Lease)
	st.taken.Add(1)
	st.leased.Add(g.extra)
	if g.window != sl.window || !sent.Before(sl.until) || g.gen != sl.gen {
		// A slice of an earlier window ended with it; one of another
		// generation was granted by a counter Redis has since forgotten
		// (restarted or flushed): admitting from it could pass the limit.
		sl.left, sl.size = 0, 0
		sl.returns++
	}
	sl.gen = g.gen
	sl.left += g.extra
	sl.size += g.extra
	sl.window = g.window
	sl.until = sl.reset.Add(-slack(h.Rule))
}
