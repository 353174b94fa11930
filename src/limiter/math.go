package limiter

import "time"

// This file is the reference arithmetic of the three algorithms. The Redis
// scripts in src/redis/*.lua mirror it line for line (same integer steps, same
// rounding) so both stores give identical answers; change them together.
//
// Units: instants and durations are int64 microseconds. Every Period is a whole
// number of seconds and at most MaxPeriod, and every Limit and Burst at most
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
type state struct {
	w    int64
	x, y uint64
}

// step applies cost hits at now (µs) to st under r. It returns the new state
// (equal to st when nothing was counted), the outcome, and the instant (µs)
// after which the new state is indistinguishable from no state at all.
func step(st state, now int64, r Rule, cost uint64) (state, Outcome, int64) {
	switch r.Algorithm {
	case SlidingWindow:
		return slidingStep(st, now, r, cost)
	case TokenBucket:
		return tokenStep(st, now, r, cost)
	default:
		return fixedStep(st, now, r, cost)
	}
}

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

func fixedStep(st state, now int64, r Rule, cost uint64) (state, Outcome, int64) {
	p := periodUS(r)
	w := now / p
	var count uint64
	if st.w == w {
		count = st.x
	}
	end := (w + 1) * p
	out := Outcome{Allowed: fits(count, cost, r.Limit), ResetAfter: usToDuration(end - now)}
	if out.Allowed {
		count += cost
	} else {
		out.RetryAfter = out.ResetAfter
	}
	if count < r.Limit {
		out.Remaining = r.Limit - count
	}
	return state{w: w, x: count}, out, end
}

// slidingWeight is the share, in thousandths, of the previous window that
// still overlaps a window of length pms ending at elapsedMS into the current
// one.
func slidingWeight(pms, elapsedMS int64) uint64 {
	return uint64((pms - elapsedMS) * slidingScale / pms)
}

func ceilDiv(a, b uint64) uint64 { return (a + b - 1) / b }

func slidingStep(st state, now int64, r Rule, cost uint64) (state, Outcome, int64) {
	p := periodUS(r)
	pms := p / 1000
	w := now / p
	var cur, prev uint64
	switch st.w {
	case w:
		cur, prev = st.x, st.y
	case w - 1:
		prev = st.x
	}
	start := w * p
	elapsedMS := (now - start) / 1000
	used := ceilDiv(prev*slidingWeight(pms, elapsedMS), slidingScale) + cur
	out := Outcome{Allowed: fits(used, cost, r.Limit)}
	if out.Allowed {
		cur += cost
		used += cost
	} else {
		out.RetryAfter = usToDuration(slidingRetry(now, start, pms, prev, cur, cost, r.Limit))
	}
	if used < r.Limit {
		out.Remaining = r.Limit - used
	}
	switch {
	case cur > 0:
		out.ResetAfter = usToDuration(start + 2*p - now)
	case prev > 0:
		out.ResetAfter = usToDuration(start + p - now)
	}
	return state{w: w, x: cur, y: prev}, out, start + 2*p
}

// slidingRetry returns the instant (µs) at which cost hits first fit again,
// assuming nothing else arrives.
func slidingRetry(now, start, pms int64, prev, cur, cost, limit uint64) int64 {
	if limit == 0 || cost > limit {
		// Never fits; point at the next window as the least wrong hint.
		return start + pms*1000 - now
	}
	if cur+cost > limit {
		// The current window must become the previous one and decay.
		start += pms * 1000
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

func tokenStep(st state, now int64, r Rule, cost uint64) (state, Outcome, int64) {
	burst := r.Burst
	if burst == 0 {
		burst = r.Limit
	}
	tat := st.w
	if tat < now {
		tat = now
	}
	if r.Limit == 0 {
		return state{w: tat}, Outcome{RetryAfter: r.Period, ResetAfter: usToDuration(tat - now)}, tat
	}
	p := periodUS(r)
	interval := (p + int64(r.Limit) - 1) / int64(r.Limit) // emission interval, rounded up
	capacity := interval * int64(burst)
	out := Outcome{}
	newTat := tat
	if cost <= burst {
		newTat = tat + int64(cost)*interval
		out.Allowed = newTat-now <= capacity
	}
	if out.Allowed {
		tat = newTat
	} else if cost <= burst {
		out.RetryAfter = usToDuration(newTat - now - capacity)
	} else {
		out.RetryAfter = usToDuration(tat - now)
	}
	out.ResetAfter = usToDuration(tat - now)
	if left := capacity - (tat - now); left > 0 { // negative after burst was lowered
		out.Remaining = uint64(left / interval)
	}
	return state{w: tat}, out, tat
}
