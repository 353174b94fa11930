package limiter

import (
	"slices"
	"time"
)

// This file is the reference arithmetic of the five algorithms. The Redis
// scripts in src/redis/*.lua mirror it line for line (same integer steps, same
// rounding) so both stores give identical answers; change them together.
//
// Units: instants and durations are int64 microseconds. Every Period is a whole
// number of seconds and at most MaxPeriod (a Calendar's windows, from
// windowAt, at most a year of 366 days), and every Limit and Burst at most
// MaxLimit, which keeps every intermediate value below 2^53: the scripts run on
// Lua's doubles and must stay exact.

const (
	// MaxLimit is the largest Limit or Burst a Rule may carry (the RLS wire
	// format's requests_per_unit is a uint32).
	MaxLimit = 1<<32 - 1
	// MaxPeriod is the longest Period a Rule may carry.
	MaxPeriod = 10 * 366 * 24 * time.Hour
	// slidingScale is the resolution of the sliding window's weight: the
	// previous window counts in thousandths.
	slidingScale = 1000
)

// state is what a store keeps per key. Its fields mean, per algorithm:
//
//	FixedWindow:   w = window number (now / period), x = hits counted in it
//	SlidingWindow: w = current window number, x = its count, y = previous window's count
//	TokenBucket:   w = theoretical arrival time (GCRA's TAT) in microseconds
//	SlidingLog:    log = the counted hits (see logStep)
//	Concurrency:   log = the slots held, by when each was taken (see logStep)
type state struct {
	w    int64
	x, y uint64
	// log is SlidingLog's state: the counted hits, oldest first, one entry
	// per call that counted. Steps never modify it in place: a new state
	// gets a new slice, so a stored state is never changed through another.
	// A pointer, so that the other algorithms' states (every counter of the
	// memory store) pay 8 bytes for it, not a slice header's 24.
	log *[]logEntry
}

// logEntry is n hits counted at t (µs).
type logEntry struct {
	t int64
	n uint64
}

// maxCount caps a window's count. Only overdraft and CountRejected let a
// count pass its limit (at most 2^32-1); the cap keeps a count times the
// sliding window's weight scale below 2^53, exact in the scripts' doubles.
const maxCount = 1 << 42

// step applies cost hits at now (µs) to st under r, or gives cost hits back
// when refund is set. It returns the new state, the outcome, the instant
// (µs) after which the new state is indistinguishable from no state at all,
// and whether the new state is to be written: for an allowed hit, an
// overdraft hit that was counted although it did not fit, or a refund that
// gave something back.
func step(st state, now int64, r Rule, cost uint64, refund bool) (state, Outcome, int64, bool) {
	switch r.Algorithm {
	case SlidingWindow:
		return slidingStep(st, now, r, cost, refund)
	case TokenBucket:
		return tokenStep(st, now, r, cost, refund)
	case SlidingLog, Concurrency:
		return logStep(st, now, r, cost, refund)
	default:
		return fixedStep(st, now, r, cost, refund)
	}
}

// admits decides a hit of cost on top of used under r. Without overdraft
// this is fits; with it, there must also be budget left, so that a check
// (cost 0) is rejected once usage has reached the limit. CountRejected
// asks only that the count after the hit not pass the limit, as
// envoyproxy/ratelimit does (a check of a limit of 0 then passes too).
func admits(used, cost uint64, r Rule) bool {
	switch {
	case r.Overdraft:
		return used < r.Limit && cost <= r.Limit-used
	case r.CountRejected:
		return used <= r.Limit && cost <= r.Limit-used
	}
	return fits(used, cost, r.Limit)
}

// countsRejected reports whether r counts a hit that it rejects.
func countsRejected(r Rule) bool { return r.Overdraft || r.CountRejected }

func periodUS(r Rule) int64 { return int64(r.Period / time.Microsecond) }

func usToDuration(us int64) time.Duration {
	if us <= 0 {
		return 0
	}
	return time.Duration(us) * time.Microsecond
}

// fits reports whether cost more hits fit on top of used under limit.
// A limit of 0 rejects even a cost of 0: "requests_per_unit: 0" means deny.
func fits(used, cost, limit uint64) bool {
	return limit > 0 && used <= limit && cost <= limit-used
}

func fixedStep(st state, now int64, r Rule, cost uint64, refund bool) (state, Outcome, int64, bool) {
	w, _, end, _ := windowAt(now, r)
	var count uint64
	if st.w == w {
		count = st.x
	}
	out := Outcome{ResetAfter: usToDuration(end - now)}
	write := false
	switch {
	case refund && cost > 0:
		out.Allowed, write = true, count > 0
		count -= min(count, cost)
	case admits(count, cost, r):
		out.Allowed, write = true, true
		count += cost
	default:
		out.RetryAfter = out.ResetAfter
		if countsRejected(r) && cost > 0 {
			count, write = min(count+min(cost, maxCount), maxCount), true
		}
	}
	if count < r.Limit {
		out.Remaining = r.Limit - count
	} else if write && !out.Allowed {
		out.Excess = count - r.Limit
	}
	return state{w: w, x: count}, out, end, write
}

// slidingWeight is the share, in thousandths, of the previous window that
// still overlaps a window of length pms ending at elapsedMS into the current
// one.
func slidingWeight(pms, elapsedMS int64) uint64 {
	return uint64((pms - elapsedMS) * slidingScale / pms)
}

func ceilDiv(a, b uint64) uint64 { return (a + b - 1) / b }

func slidingStep(st state, now int64, r Rule, cost uint64, refund bool) (state, Outcome, int64, bool) {
	// A calendar window's length is its own (a day of 23 or 25 hours):
	// the previous window is weighed by its overlap with a window of the
	// current one's length ending now.
	w, start, end, next := windowAt(now, r)
	pms := (end - start) / 1000
	var cur, prev uint64
	switch st.w {
	case w:
		cur, prev = st.x, st.y
	case w - 1:
		prev = st.x
	}
	elapsedMS := (now - start) / 1000
	weight := slidingWeight(pms, elapsedMS)
	used := ceilDiv(prev*weight, slidingScale) + cur
	out := Outcome{}
	write := false
	switch {
	case refund && cost > 0:
		// Give back from the current window first, then the previous one.
		fromCur := min(cur, cost)
		fromPrev := min(prev, cost-fromCur)
		cur, prev = cur-fromCur, prev-fromPrev
		out.Allowed, write = true, fromCur+fromPrev > 0
		used = ceilDiv(prev*weight, slidingScale) + cur
	case admits(used, cost, r):
		out.Allowed, write = true, true
		cur += cost
		used += cost
	case r.Overdraft:
		if cost > 0 {
			cur, write = min(cur+min(cost, maxCount), maxCount), true
			used = ceilDiv(prev*weight, slidingScale) + cur
		}
		// Until usage is under the limit again: one more hit fits.
		out.RetryAfter = usToDuration(slidingRetry(now, start, end, next, pms, prev, cur, 1, r.Limit))
	default:
		out.RetryAfter = usToDuration(slidingRetry(now, start, end, next, pms, prev, cur, cost, r.Limit))
	}
	if used < r.Limit {
		out.Remaining = r.Limit - used
	}
	switch {
	case cur > 0:
		out.ResetAfter = usToDuration(next - now)
	case prev > 0:
		out.ResetAfter = usToDuration(end - now)
	}
	return state{w: w, x: cur, y: prev}, out, next, write
}

// slidingRetry returns the instant (µs) at which cost hits first fit again,
// assuming nothing else arrives: the current window ends at end, the next
// at next (a calendar's windows differ in length).
func slidingRetry(now, start, end, next, pms int64, prev, cur, cost, limit uint64) int64 {
	if limit == 0 || cost > limit {
		// Never fits; point at the next window as the least wrong hint.
		return end - now
	}
	if cur+cost > limit {
		// The current window must become the previous one and decay.
		start, pms = end, (next-end)/1000
		prev, cur = cur, 0
	}
	room := limit - cur - cost
	// Largest weight w with ceil(prev*w/1000) <= room, then the first
	// elapsed millisecond at which slidingWeight drops to it.
	wmax := room * slidingScale / prev
	elapsed := pms - int64(wmax+1)*pms/slidingScale
	if int64(wmax+1)*pms%slidingScale == 0 {
		elapsed++
	}
	at := start + elapsed*1000
	if at < now {
		at = now
	}
	return at - now
}

// maxDebt bounds how far past a full bucket's worth of waiting overdraft
// may push a token bucket's TAT: any debt beyond it is as good as forever,
// and the bound keeps TATs below 2^53 µs.
const maxDebt = int64(2 * MaxPeriod / time.Microsecond)

func tokenStep(st state, now int64, r Rule, cost uint64, refund bool) (state, Outcome, int64, bool) {
	burst := r.Burst
	if burst == 0 {
		burst = r.Limit
	}
	tat := st.w
	if tat < now {
		tat = now
	}
	if r.Limit == 0 {
		if refund && cost > 0 {
			return state{w: tat}, Outcome{Allowed: true, ResetAfter: usToDuration(tat - now)}, tat, false
		}
		return state{w: tat}, Outcome{RetryAfter: r.Period, ResetAfter: usToDuration(tat - now)}, tat, false
	}
	p := periodUS(r)
	interval := (p + int64(r.Limit) - 1) / int64(r.Limit) // emission interval, rounded up
	capacity := interval * int64(burst)
	out := Outcome{}
	write := false
	// ahead is how far cost hits move the TAT, bounded (cost may be 2^64-1).
	ahead := maxDebt + capacity
	if cost <= uint64(ahead/interval) {
		ahead = int64(cost) * interval
	}
	left := capacity - (tat - now) // in µs of refill; negative in debt
	switch {
	case refund && cost > 0:
		// Never more than a full bucket: the TAT does not go below now.
		newTat := max(tat-ahead, now)
		out.Allowed, write = true, newTat != tat
		tat = newTat
	case cost <= burst && tat+ahead-now <= capacity && (!r.Overdraft || left > 0):
		out.Allowed, write = true, true
		tat += ahead
	case r.Overdraft:
		if cost > 0 {
			tat, write = min(tat+ahead, now+capacity+maxDebt), true
		}
		// Until a check passes again: some refill left in the bucket.
		out.RetryAfter = usToDuration(tat - now - capacity + 1)
	case cost <= burst:
		out.RetryAfter = usToDuration(tat + ahead - now - capacity)
	default:
		out.RetryAfter = usToDuration(tat - now)
	}
	out.ResetAfter = usToDuration(tat - now)
	if left := capacity - (tat - now); left > 0 { // negative after burst was lowered, or in debt
		out.Remaining = uint64(left / interval)
	}
	return state{w: tat}, out, tat, write
}

// logStep is SlidingLog and Concurrency. A hit at t counts while
// now-Period < t <= now, so any half-open span of one Period holds at most
// Limit counted hits (for Concurrency: at most Limit slots are held at
// once, each for at most Period). The log keeps at most 2*Limit hits:
// overdraft counts past the limit up to there (an ever longer log would
// cost memory without changing any answer but how long a debt lasts).
// A SlidingLog refund gives back the newest hits (those it most likely
// counted); a Concurrency refund the oldest slots, so that a slot whose
// release was lost goes first rather than expiring under a live one.
func logStep(st state, now int64, r Rule, cost uint64, refund bool) (state, Outcome, int64, bool) {
	p := periodUS(r)
	var log []logEntry
	if st.log != nil {
		log = *st.log
	}
	for len(log) > 0 && log[0].t <= now-p {
		log = log[1:]
	}
	var used uint64
	for _, e := range log {
		used += e.n
	}
	out := Outcome{}
	write := false
	switch {
	case refund && cost > 0:
		give := min(cost, used)
		write = give > 0
		if r.Algorithm == Concurrency {
			log = giveOldest(log, give)
		} else {
			log = giveNewest(log, give)
		}
		used -= give
		out.Allowed = true
	case admits(used, cost, r):
		out.Allowed, write = true, true
		log = logAppend(log, now, cost)
		used += cost
	case r.Overdraft:
		if add := min(cost, 2*r.Limit-min(used, 2*r.Limit)); add > 0 {
			log, write = logAppend(log, now, add), true
			used += add
		}
		// Until a check passes: used under the limit.
		out.RetryAfter = usToDuration(logRetry(log, now, p, used, 1, r.Limit))
	default:
		out.RetryAfter = usToDuration(logRetry(log, now, p, used, cost, r.Limit))
	}
	if used < r.Limit {
		out.Remaining = r.Limit - used
	}
	exp := now
	if len(log) > 0 {
		out.ResetAfter = usToDuration(log[0].t + p - now)
		exp = log[len(log)-1].t + p
	}
	return state{log: &log}, out, exp, write
}

// giveNewest returns log without its newest n hits (n at most its count),
// in a new slice: a stored log is never changed in place.
func giveNewest(log []logEntry, n uint64) []logEntry {
	log = slices.Clone(log)
	for n > 0 {
		last := &log[len(log)-1]
		take := min(last.n, n)
		last.n -= take
		n -= take
		if last.n == 0 {
			log = log[:len(log)-1]
		}
	}
	return log
}

// giveOldest returns log without its oldest n hits (n at most its count),
// sharing no entry it changed with log.
func giveOldest(log []logEntry, n uint64) []logEntry {
	for n > 0 && log[0].n <= n {
		n -= log[0].n
		log = log[1:]
	}
	if n == 0 {
		return log
	}
	out := slices.Clone(log)
	out[0].n -= n
	return out
}

// logAppend returns log with n hits at now. It appends in place when the
// backing array has room: a stored log and the states derived from it
// share one array, each seeing only its own length, and a state derived
// later always extends the longest (a batch chains hits on one key, and
// shard locks serialize batches), so nothing a live state sees is ever
// overwritten. An append to a full array reallocates with room to grow:
// a hit costs O(1), not a copy of the log. Adding to the newest entry
// (same microsecond) copies, since that entry is shared.
func logAppend(log []logEntry, now int64, n uint64) []logEntry {
	if n == 0 {
		return log
	}
	if len(log) > 0 && log[len(log)-1].t == now {
		out := slices.Clone(log)
		out[len(out)-1].n += n
		return out
	}
	return append(log, logEntry{t: now, n: n})
}

// logRetry is how long until cost more hits fit on top of the log's used
// ones as the oldest leave the window: the instant the hit that must go
// last leaves. It is a whole window when they never fit.
func logRetry(log []logEntry, now, p int64, used, cost, limit uint64) int64 {
	if limit == 0 || cost > limit {
		return p
	}
	need := used + cost - limit // hits that must leave first (used <= 2*limit)
	for _, e := range log {
		if e.n >= need {
			return e.t + p - now
		}
		need -= e.n
	}
	return p
}
