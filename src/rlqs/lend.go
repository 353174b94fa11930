package rlqs

import (
	"math"
	"time"

	"github.com/openrls/ratelimit/src/rlqs/plan"
)

// Lending: what a bucket did not use of a window, its reports give back.
//
// A window's need (ledger.need) bounds what the bucket may admit in it
// from the token buckets it may hold: the tokens it may carry in, the
// resets, and every rate that may be in force, integrated over the whole
// window. The store holds that from the start. But the Envoy reports what
// it admitted, every reporting interval (5 s in Envoy 1.40), and a window
// longer than that (a limit per minute, per hour) is mostly over by its
// last reports: past a report, the bucket can have admitted no more than
// the reports since the window began say, plus what its token bucket
// can admit from the report's cut on. So the need falls to
//
//	the allowed requests of every report received in the window
//	+ the capacity that may be in force at a mark (a round's time) no
//	  later than the report's cut, and the resets
//	+ the envelope's integral from that mark to the window's end, rounded
//	  down,
//
// when that is less, and the round gives the rest back (lends it to the
// pool). Reports received in the window may count requests admitted just
// before it: that errs toward holding more. A report's cut is taken to be
// no earlier than its receipt less the delivery bound, the same bound
// the service assumes for its own messages (docs/rlqs.md); a report
// slower than that could have its last moments before the cut counted
// in neither. A window too short for a round to fall in it a delivery
// bound before a report (a second, with the default bound) lends nothing.
//
// Before, a limit of 300 a minute shared by 4 Envoys of 1 a second with
// Poisson arrivals was all held 44 s into a minute that admitted 175 in
// all: each change of grant holds both grants' rates until it hands over,
// and a growth a reset, so churn spent the window on paper, and the grants
// were cut to a few tokens a minute for the rest of it.
type lending struct {
	w    int64     // the window the reports below were received in
	used uint64    // their allowed requests
	cut  time.Time // the last one's cut, at the earliest
	// marks are the last rounds' (a ring, nmark taken in all). A clone
	// records the same ones as the ledger it was made from: a round
	// clones at its own time, after advancing to it, and nothing before
	// that time differs between them.
	marks [marks]mark
	nmark int
}

// mark is what a ledger knew of its present window at one round: the
// envelope's integral in it up to then, and the largest capacity that
// may have been in force.
type mark struct {
	t     time.Time
	w     int64
	past  float64
	burst uint64
	// resets is how many resets had been noted in the window, and
	// resetsBy when the last of them may fall, at the latest.
	resets   uint64
	resetsBy time.Time
}

// marks is how many rounds' marks a ledger keeps: a report's cut must
// fall after one, so they reach back past the delivery bound by a push.
const marks = 8

// noteMark records the present's mark (see advance).
func (l *ledger) noteMark(now time.Time) {
	lt := l.lent
	if lt == nil || lt.nmark > 0 && !lt.marks[(lt.nmark-1)%marks].t.Before(now) {
		return
	}
	w := l.window(now)
	x := l.wins.get(w)
	lt.marks[lt.nmark%marks] = mark{t: now, w: w, past: x.past, burst: l.burst, resets: x.resets, resetsBy: l.resetsBy}
	lt.nmark++
}

// noteReport notes a report of allowed requests received at now, whose
// cut was no earlier than cut.
func (l *ledger) noteReport(now, cut time.Time, allowed uint64) {
	w := l.window(now)
	if l.lent.w != w {
		l.lent.w, l.lent.used, l.lent.cut = w, 0, time.Time{}
	}
	l.lent.used = plan.SatAdd(l.lent.used, allowed)
	l.lent.cut = cut
}

// lentNeed is window w's need from its reports (see lending), and whether
// they bound it; sum is the envelope's integral over the window, c the
// capacity its need counts for the tokens the bucket may hold, and resets
// the times it may start full again in it.
//
// From the mark on, the bucket may admit its tokens then (at most the
// largest capacity in force since), a capacity for each reset that may
// fall after the mark, and the envelope's integral. A reset is noted when
// its grant is sent and falls within the delivery bound after: one noted
// before the mark may fall after it, so only those noted before a mark
// whose resets had all fallen by the chosen mark's time are left out.
func (l *ledger) lentNeed(w int64, sum float64, c, resets uint64) (uint64, bool) {
	lt := l.lent
	if lt == nil || lt.w != w || lt.cut.IsZero() {
		return 0, false
	}
	var at *mark
	for i := range min(lt.nmark, marks) {
		m := &lt.marks[i]
		if m.w == w && !m.t.After(lt.cut) && (at == nil || m.t.After(at.t)) {
			at = m
		}
	}
	if at == nil {
		return 0, false
	}
	var before uint64
	for i := range min(lt.nmark, marks) {
		m := &lt.marks[i]
		if m.w == w && !m.resetsBy.After(at.t) && m.resets > before {
			before = m.resets
		}
	}
	for i := range min(lt.nmark, marks) {
		if m := &lt.marks[i]; m.w == w && !m.t.Before(at.t) {
			c = max(c, m.burst)
		}
	}
	after := resets - min(before, resets)
	tail := math.Max(sum-at.past, 0)
	return plan.SatAdd(lt.used, c+c*after+uint64(math.Floor(tail+1e-6))), true
}

// lend calls f for the present window when the store holds more for this
// bucket than its reports leave it needing (see lending), with the
// difference, and holds only the need: the caller gives the rest back.
func (l *ledger) lend(now time.Time, f func(w int64, n uint64)) {
	w := l.window(now)
	x := l.wins.at(w)
	if n := l.need(w); x.held > n {
		f(w, x.held-n)
		x.held = n
	}
}

// noteLending notes a report of b's allowed requests received at now,
// cut no earlier than the delivery bound before, in its ledgers; the next
// round lends what it leaves unneeded.
func (g *state) noteLending(b *bucket, allowed uint64, now time.Time) {
	for _, m := range b.members {
		m.l.noteReport(now, now.Add(-g.o.Delivery), allowed)
	}
	if !b.lending {
		b.lending = true
		g.lenders = append(g.lenders, b)
	}
}

// lends gives back, as asks, what the buckets reported since the last
// round hold past their present windows' need. Run before the round
// plans.
func (g *state) lends(now time.Time) []*ask {
	var back []*ask
	for _, b := range g.lenders {
		b.lending = false
		if b.gone {
			continue
		}
		for _, m := range b.members {
			m.l.advance(now)
			m.l.lend(now, func(w int64, n uint64) {
				back = append(back, &ask{rule: m.p.rule, window: w, tokens: n, at: now, key: m.p.key, back: true})
			})
		}
	}
	g.lenders = g.lenders[:0]
	return back
}
