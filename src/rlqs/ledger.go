package rlqs

import (
	"math"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

// ledger is what one Envoy's bucket may admit against one limit, window by
// window, and how much of each window the store holds for it.
//
// An assignment is a token bucket of a small capacity refilled at a rate; it may
// be in force from the moment it is sent until it is replaced or its TTL
// runs out on the Envoy, which starts counting when the message arrives:
// no later than the send plus the delivery bound. So the ledger keeps the
// envelope of every rate that may be in force at each instant (the highest),
// and a window's need is
//
//	the capacity (the tokens the bucket may hold when the window starts)
//	+ the capacity × resets in the window (a bucket that lapsed starts
//	  full again)
//	+ the envelope's integral over the window, rounded down: requests
//	  take whole tokens.
//
// The store is asked for the difference between a window's need and what
// it already holds for this bucket. Once a grant's message has left, the
// grants before it end when it arrives, no later than its send plus the
// delivery bound: from then on the envelope is that grant's and those sent
// after it, and what the store holds past a window's need is given back
// (handOver).
type ledger struct {
	period time.Duration
	segs   []seg // the envelope from the present on, sorted, disjoint
	wins   wins  // what is known of each window from the present's on
	// began is when the envelope first rose: a window that starts after it
	// may open with the token the bucket kept. (A bucket whose assignment
	// lapsed since starts again full: that is a reset, counted apart.)
	began time.Time
	// burst is the largest capacity that may be in force, until
	// burstUntil; sent is the capacity last sent, which burst falls back
	// to after that.
	burst, sent uint64
	burstUntil  time.Time
	// grants are the grants sent that a hand-over may still need: each
	// one's rate from its send to its horizon, and its capacity (DENY_ALL:
	// none). Those before the last hand-over's are forgotten, and so is
	// each at its horizon.
	grants []sentGrant
	nextID uint64
	// handedAt is when the last hand-over took effect: from then on, the capacity in
	// force is at most handedCap, the largest sent since the grant handedAt
	// over to (that one included).
	handedAt  time.Time
	handedCap uint64
	// lent is what the bucket's reports say it admitted in the present
	// window, and the last rounds' marks (see lending): shared by the
	// ledger's clones, which every round makes of every bucket's, rather
	// than copied into each (a clone was four times the size with them).
	lent *lending
	// resetsBy is when the last reset noted may fall, at the latest.
	resetsBy time.Time
}

// sentGrant is one grant a ledger noted (see ledger.note).
type sentGrant struct {
	id  uint64
	s   seg
	cap uint64
}

// seg is a stretch of the envelope at one rate, in tokens per second.
type seg struct {
	from, to time.Time
	rate     float64
}

func newLedger(period time.Duration) *ledger {
	return &ledger{period: period, burst: 1, sent: 1, lent: &lending{}}
}

// grant notes a grant of capacity c sent at now, in force until until at
// the latest, and reports whether it grows the capacity in force (which
// counts as a reset: the bucket gains tokens).
func (l *ledger) grant(c uint64, now, until time.Time) (grows bool) {
	if now.After(l.burstUntil) {
		l.burst = l.sent
	}
	grows = c > l.sent
	l.sent = c
	l.handedCap = max(l.handedCap, c)
	if c >= l.burst {
		l.burst, l.burstUntil = c, until
	}
	return grows
}

// window is the number of the fixed window holding t, as the stores
// count it (limiter.FixedWindowAt).
func (l *ledger) window(t time.Time) int64 {
	w, _ := limiter.FixedWindowAt(t, l.rule())
	return w
}

// start is the instant window w starts.
func (l *ledger) start(w int64) time.Time { return limiter.WindowStart(w, l.rule()) }

// rule is the fixed window of the ledger's period.
func (l *ledger) rule() limiter.Rule {
	return limiter.Rule{Algorithm: limiter.FixedWindow, Period: l.period}
}

// advance folds the envelope before now into the per-window integrals
// and forgets windows that have ended.
func (l *ledger) advance(now time.Time) {
	cur := l.window(now)
	keep := l.segs[:0]
	for _, s := range l.segs {
		if !s.from.Before(now) {
			keep = append(keep, s)
			continue
		}
		l.addIntegral(s.from, minTime(s.to, now), s.rate)
		if s.to.After(now) {
			keep = append(keep, seg{now, s.to, s.rate})
		}
	}
	l.segs = keep
	l.wins.dropBefore(cur)
	gs := l.grants[:0]
	for _, g := range l.grants {
		if g.s.to.After(now) {
			gs = append(gs, g)
		}
	}
	l.grants = gs
	l.noteMark(now)
}

// note records a grant of rate s.rate over s (DENY_ALL: a zero seg) and
// capacity c, and returns the id a hand-over to it names.
func (l *ledger) note(s seg, c uint64) uint64 {
	l.nextID++
	l.grants = append(l.grants, sentGrant{l.nextID, s, c})
	return l.nextID
}

// addIntegral adds rate × the part of [from, to) in each window to its past.
func (l *ledger) addIntegral(from, to time.Time, rate float64) {
	for from.Before(to) {
		w := l.window(from)
		end := minTime(to, l.start(w+1))
		l.wins.at(w).past += rate * end.Sub(from).Seconds()
		from = end
	}
}

// raise makes the envelope at least rate over [from, to).
func (l *ledger) raise(from, to time.Time, rate float64) {
	if l.began.IsZero() {
		l.began = from
	}
	out := make([]seg, 0, len(l.segs)+3)
	cur := from
	for _, s := range l.segs {
		if !s.to.After(from) || !s.from.Before(to) {
			out = append(out, s)
			continue
		}
		if s.from.Before(from) {
			out = append(out, seg{s.from, from, s.rate})
		}
		if cur.Before(s.from) {
			out = append(out, seg{cur, s.from, rate})
		}
		lo, hi := maxTime(s.from, from), minTime(s.to, to)
		out = append(out, seg{lo, hi, math.Max(rate, s.rate)})
		cur = hi
		if s.to.After(to) {
			out = append(out, seg{to, s.to, s.rate})
		}
	}
	if cur.Before(to) {
		out = append(out, seg{cur, to, rate})
	}
	sortSegs(out)
	l.segs = coalesce(out)
}

// reset notes that a bucket may start full again at a moment in [from, to].
func (l *ledger) reset(from, to time.Time) {
	l.resetsBy = maxTime(l.resetsBy, to)
	for w := l.window(from); w <= l.window(to); w++ {
		l.wins.at(w).resets++
	}
}

// need is what window w needs in all.
func (l *ledger) need(w int64) uint64 {
	x := l.wins.get(w)
	sum := x.past
	touched := sum > 0
	ws, we := l.start(w), l.start(w+1)
	for _, s := range l.segs {
		lo, hi := maxTime(s.from, ws), minTime(s.to, we)
		if lo.Before(hi) {
			touched = true
			sum += s.rate * hi.Sub(lo).Seconds()
		}
	}
	if !touched && x.resets == 0 {
		return 0
	}
	// The capacity that may be in force as the window starts: the largest
	// sent, or after a hand-over the largest sent since.
	c := l.burst
	if !l.handedAt.IsZero() && !ws.Before(l.handedAt) {
		c = min(c, l.handedCap)
	}
	var kept uint64
	if touched && !l.began.IsZero() && l.began.Before(ws) {
		kept = c
	}
	// Requests are whole: a bucket that may hold kept tokens as the window
	// starts, start full resets times and refill sum tokens in it admits
	// at most the floor of their sum (a request takes a whole token), and
	// kept and the resets are whole already. A hair is added first, so a
	// float sum a hair below a whole number counts as that number, never
	// one less: rounding errs toward holding more.
	full := kept + c*x.resets + uint64(math.Floor(sum+1e-6))
	if n, ok := l.lentNeed(w, sum, c, x.resets); ok {
		return min(full, n)
	}
	return full
}

// handOver notes that grant id's message has left, so that from at on
// (when it has reached the Envoy and replaced what it held) only that
// grant and those sent after it may be in force: the envelope after at
// falls to theirs, and so does the capacity in force. It then calls f for
// every window from now's on where the store holds more for this bucket
// than the window now needs, with the difference, and holds only the need:
// the caller gives the rest back. A message that never leaves (dropped for
// a slow reader, or late) hands nothing over: the grants before it stay in
// force, and held, to their own horizons.
func (l *ledger) handOver(now, at time.Time, id uint64, f func(w int64, n uint64)) {
	if at.Before(l.handedAt) {
		return // a later grant was handed over already
	}
	var kept []sentGrant
	var c uint64
	for _, g := range l.grants {
		if g.id >= id {
			kept = append(kept, g)
			c = max(c, g.cap)
		}
	}
	l.grants = kept
	out := make([]seg, 0, len(l.segs)+len(kept))
	for _, s := range l.segs {
		if s.from.Before(at) {
			out = append(out, seg{s.from, minTime(s.to, at), s.rate})
		}
	}
	var after []seg
	for _, g := range kept {
		if g.s.to.After(at) && g.s.rate > 0 {
			after = append(after, seg{maxTime(g.s.from, at), g.s.to, g.s.rate})
		}
	}
	l.segs = coalesce(out)
	for _, s := range after {
		l.raise(s.from, s.to, s.rate)
	}
	l.handedAt, l.handedCap = at, c
	cur := l.window(now)
	for i := range l.wins {
		x := &l.wins[i]
		if x.w < cur {
			continue
		}
		if n := l.need(x.w); x.held > n {
			f(x.w, x.held-n)
			x.held = n
		}
	}
}

// shortfall calls f, for every window from now's to the envelope's end,
// with what the store must still grant to cover the window's need, where
// that is more than nothing.
func (l *ledger) shortfall(now time.Time, f func(w int64, n uint64)) {
	last := l.window(now)
	if n := len(l.segs); n > 0 {
		last = max(last, l.window(l.segs[n-1].to.Add(-time.Nanosecond)))
	}
	for _, x := range l.wins {
		if x.resets > 0 {
			last = max(last, x.w)
		}
	}
	for w := l.window(now); w <= last; w++ {
		if n, held := l.need(w), l.wins.get(w).held; n > held {
			f(w, n-held)
		}
	}
}

// clone copies l, to try a rate without committing it.
func (l *ledger) clone() *ledger {
	c := *l
	c.segs = append([]seg(nil), l.segs...)
	c.wins = append(wins(nil), l.wins...)
	c.grants = append([]sentGrant(nil), l.grants...)
	return &c
}

func sortSegs(s []seg) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j].from.Before(s[j-1].from); j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

func coalesce(s []seg) []seg {
	out := s[:0]
	for _, x := range s {
		if !x.from.Before(x.to) {
			continue
		}
		if n := len(out); n > 0 && out[n-1].rate == x.rate && out[n-1].to.Equal(x.from) {
			out[n-1].to = x.to
			continue
		}
		out = append(out, x)
	}
	return out
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// win is what a ledger knows of one window.
type win struct {
	w      int64
	past   float64 // the envelope's integral before the present
	resets uint64  // times the bucket may start full again in it
	held   uint64  // tokens the store holds for this bucket
}

// wins is a ledger's windows, sorted. They are few (from the present's to
// the end of the TTL's reach), and every round clones every bucket's
// ledger: a short slice costs one allocation where maps cost several,
// which under bucket churn was most of the service's garbage.
type wins []win

// get returns window w's record, zero if there is none.
func (ws wins) get(w int64) win {
	for _, x := range ws {
		if x.w == w {
			return x
		}
	}
	return win{w: w}
}

// at returns window w's record, added if there was none.
func (ws *wins) at(w int64) *win {
	s := *ws
	i := 0
	for i < len(s) && s[i].w < w {
		i++
	}
	if i == len(s) || s[i].w != w {
		s = append(s, win{})
		copy(s[i+1:], s[i:])
		s[i] = win{w: w}
		*ws = s
	}
	return &(*ws)[i]
}

// dropBefore forgets the windows before w.
func (ws *wins) dropBefore(w int64) {
	s := *ws
	i := 0
	for i < len(s) && s[i].w < w {
		i++
	}
	*ws = append(s[:0], s[i:]...)
}
