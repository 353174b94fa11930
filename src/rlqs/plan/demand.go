package plan

import (
	"math"
	"time"
)

// Demand estimates one bucket's demand, in requests per second, from its
// reports: what it counted over each interval between them. Every
// estimate is stated in time, not in reports, so a bucket reporting every
// second and one reporting every 10 s are read alike: demand is the rate
// over steadySpan of reports since it last changed past chance (further
// back, to a minute, while those hold few requests: see steadyLongSpan),
// and a swing back within burstSpan (or three of the bucket's own intervals,
// where that is longer) is a burst.
type Demand struct {
	rate     float64 // +Inf until measured
	interval float64 // the bucket's reporting interval, seconds, as learned; 0 until one is seen
	steady   steady
	swings   swings
}

// NewDemand is the demand of a bucket not yet measured.
func NewDemand() Demand { return Demand{rate: math.Inf(1)} }

// Rate is the demand, requests per second: +Inf until known, 0 idle.
func (d *Demand) Rate() float64 { return d.rate }

// Noise is one standard deviation of Rate, requests per second: what
// chance alone moves it by, read as Poisson counts over the intervals it
// was read from (at least one request's worth); 0 until known.
func (d *Demand) Noise() float64 {
	r := d.steady.rate()
	if r.secs <= 0 {
		return 0
	}
	return math.Sqrt(math.Max(float64(r.n), 1)) / r.secs
}

// Dispersion is how far the bucket's counts spread, as their variance
// over their mean (1 for Poisson arrivals, near 0 for paced ones), read
// from the intervals its demand is read over (at most 1: arrivals that
// spread more are bursts, told apart in time, see swings); 0 until
// minSpread of them are in.
func (d *Demand) Dispersion() float64 { return d.steady.dispersion() }

// Interval is the bucket's reporting interval as its reports show it, 0
// until one is seen.
func (d *Demand) Interval() time.Duration {
	return time.Duration(d.interval * float64(time.Second))
}

// MinInterval is the shortest interval Observe reads: counts reported
// closer together than that (a reconnect's report beside the timer's) are
// carried into the next interval by the caller. Half of the shortest
// interval Envoy offers (1 s), so that a 1 s timer that fires a little
// early is still read on its own.
const MinInterval = 500 * time.Millisecond

// Observe takes n requests counted over dt (at least MinInterval) and
// reports whether the demand was measured for the first time or fell past
// chance (see trend): its share then frees room, worth a round at once.
func (d *Demand) Observe(n uint64, dt time.Duration) (changed bool) {
	secs := dt.Seconds()
	if d.interval == 0 {
		d.interval = secs
	} else {
		d.interval += (secs - d.interval) / 4
	}
	r := rate{n: n, secs: secs}
	est, dir := trend(d.steady.rate(), r)
	if dir != 0 {
		d.steady = steady{}
	}
	d.steady.add(r)
	if dir == 0 {
		est = d.steady.rate().perSecond()
		if d.steady.idle() {
			est = 0
		}
	}
	est = d.swings.note(dir, r, d.burstSpan(), est)
	changed = dir < 0 || math.IsInf(d.rate, 1)
	d.rate = est
	return changed
}

// burstSpan is how soon a swing back must come for demand to be taken as
// bursting: burstSpan, or three of the bucket's intervals where that is
// longer.
func (d *Demand) burstSpan() float64 {
	return math.Max(burstSpan.Seconds(), 3*d.interval)
}

// swings tells bursts from moves. Demand that turns on and off about as
// often as a bucket reports shows in each report as the phase before it,
// so shares that follow reports are always the wrong way round. A bucket
// whose demand changed past chance one way, then the other, then back,
// each within the burst span of the last, is taken as bursting: for a
// burst span after, its demand is the highest rate it reported in the
// span before, so it keeps a share through its lulls. Demand that comes
// and goes once (it moved to the bucket, then away) is followed at once
// (see trend): one turn back is not a burst.
type swings struct {
	lastDir int8    // the last change's direction: +1, -1, 0 for none yet
	since   float64 // seconds since that change
	turns   int     // changes in a row that turned back
	left    float64 // seconds left of bursting
	peaks   span    // the intervals reported lately, for their highest rate
}

// burstSpan is the least span, in time, that a swing back must come in for
// a bucket to be taken as bursting, and how long it then stays so: three
// of Envoy 1.40's 5 s intervals, where bursts of 5 s on and 5 s off turn
// back within the span. A bucket that reports less often is given three
// of its own intervals. Pinned by TestBurstsAreToldFromMoves and the
// bursty fleet pattern (TestFleetPatterns).
const burstSpan = 15 * time.Second

// note takes one interval's change of direction dir (see trend), its
// count r, the burst span (seconds) and the demand d trend made of it, and
// returns the demand.
func (sw *swings) note(dir int8, r rate, within, d float64) float64 {
	sw.peaks.add(r, within)
	sw.since += r.secs
	sw.left = math.Max(sw.left-r.secs, 0)
	if dir != 0 {
		if sw.lastDir == -dir && sw.since <= within+1e-9 {
			sw.turns++
		} else {
			sw.turns = 0
		}
		if sw.turns >= 2 {
			sw.left = within
		}
		sw.lastDir, sw.since = dir, 0
	}
	if sw.left == 0 {
		return d
	}
	return math.Max(d, sw.peaks.max())
}

// span is a bucket's last report intervals, newest first, as far back as
// they cover a span of time (and no further): each slot's requests, time
// and highest rate. An interval is merged into the newest slot while that
// slot is shorter than a spanSlots-th of the span, so a span is covered
// by at most spanSlots + 1 slots whatever the interval: a bucket reporting
// every second keeps as much time as one reporting every 5 s in as little
// room.
type span struct {
	slots [spanSlots + 1]slot
	n     int
}

type slot struct {
	rate
	peak float64
}

// spanSlots is how many slots a span is cut into. A steady span
// (steadyLongSpan) is cut into slots of 3.3 s, as long as a 20 s span's
// were in six, so that a 20 s read, its spread and idleness (see
// steady.idle) are as fine as before.
const spanSlots = 18

// add adds an interval of r to a span of secs seconds.
func (sp *span) add(r rate, secs float64) {
	if sp.n > 0 && sp.slots[0].secs < secs/spanSlots-1e-9 {
		s := &sp.slots[0]
		s.n, s.secs, s.peak = satAdd(s.n, r.n), s.secs+r.secs, math.Max(s.peak, r.perSecond())
	} else {
		copy(sp.slots[1:], sp.slots[:])
		sp.slots[0] = slot{rate: r, peak: r.perSecond()}
		sp.n = min(sp.n+1, len(sp.slots))
	}
	if _, k, ok := sp.newest(func(r rate) bool { return r.secs >= secs-1e-9 }); ok {
		sp.n = k
	}
}

// newest sums the newest slots until the sum is done, and returns it, how
// many slots it took, and whether it was done before they ran out.
func (sp *span) newest(done func(rate) bool) (sum rate, k int, ok bool) {
	for k = 1; k <= sp.n; k++ {
		s := sp.slots[k-1]
		sum.n, sum.secs = satAdd(sum.n, s.n), sum.secs+s.secs
		if done(sum) {
			return sum, k, true
		}
	}
	return sum, sp.n, false
}

// rate is the slots' requests over their time (zero time when none).
func (sp *span) rate() rate {
	var sum rate
	for _, s := range sp.slots[:sp.n] {
		sum.n, sum.secs = satAdd(sum.n, s.n), sum.secs+s.secs
	}
	return sum
}

// dispersion is the slots' counts' variance over their mean, each slot's
// expected count its part of the span's rate; at most 1, and 0 with fewer
// than minSpread slots or no requests.
func (sp *span) dispersion() float64 {
	r := sp.rate()
	if sp.n < minSpread || r.n == 0 || r.secs <= 0 {
		return 0
	}
	chi := 0.0
	for _, s := range sp.slots[:sp.n] {
		want := r.perSecond() * s.secs
		chi += (float64(s.n) - want) * (float64(s.n) - want) / want
	}
	return math.Min(chi/float64(sp.n-1), 1)
}

// minSpread is how many slots a spread is read from: two degrees of
// freedom, enough to tell paced arrivals (near 0) from Poisson's (1) most
// of the time.
const minSpread = 3

// max is the highest rate of any interval in the span.
func (sp *span) max() float64 {
	m := 0.0
	for _, s := range sp.slots[:sp.n] {
		m = math.Max(m, s.peak)
	}
	return m
}

// steady is a bucket's report intervals since its demand last changed past
// chance, over steadySpan of them, or further back, to steadyLongSpan,
// until they hold steadyCount requests: demand is their rate, not the
// last one's alone. Read from one report, a paced light bucket of 0.5 a
// second reported 2 and 3 requests in turn, and its grant swung with it,
// each change costing its Envoy the fraction of a token Envoy floors away
// on a replacement; set against several, a change is told from chance
// sooner, too.
type steady struct{ span }

func (s *steady) add(r rate) {
	s.span.add(r, steadyLongSpan.Seconds())
	enough := func(r rate) bool { return r.secs >= steadySpan.Seconds()-1e-9 && r.n >= steadyCount }
	if _, k, ok := s.newest(enough); ok {
		s.n = k
	}
}

// idle is whether the newest steadySpan of the intervals holds no request:
// a bucket read further back (see steadyLongSpan) is idle as soon as one
// read over steadySpan alone would be, so that its room is handed over
// no later than before.
func (s *steady) idle() bool {
	sum, _, ok := s.newest(func(r rate) bool { return r.n > 0 || r.secs >= steadySpan.Seconds()-1e-9 })
	return ok && sum.n == 0
}

// steadySpan bounds how far back demand is read, in time, where that holds
// steadyCount requests: a drift below chance is followed within it, and
// a quiet second is not taken for idleness (a bucket of 0.25 a second
// reports nothing in most seconds). Four of Envoy 1.40's 5 s intervals.
// Pinned by TestDemandFollowsAChangeAtOnce and TestDemandIsReadInTime.
const steadySpan = 20 * time.Second

// A light bucket's demand is read over up to steadyLongSpan, until the
// intervals hold steadyCount requests. Read over 20 s, a bucket of 0.25 a
// second with Poisson arrivals counts 5 requests on average, and was read
// under half its rate after a tenth of its reports: its grant followed,
// and its token bucket denied the requests that came next (docs/rlqs.md
// has what the per-minute fleet pattern of 8 such buckets gains). A change
// past chance is still followed at once (see trend): only a drift within
// chance is read over the longer span. Pinned by
// TestALightDemandIsReadOverEnoughRequests.
const (
	steadyLongSpan = time.Minute
	steadyCount    = 20
)

// rate is requests counted over an interval.
type rate struct {
	n    uint64
	secs float64 // 0: none measured
}

func (r rate) perSecond() float64 { return float64(r.n) / r.secs }

// satAdd is a+b, or the largest uint64 where that wraps.
func satAdd(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}

// SatAdd is a+b, or the largest uint64 where that wraps: a client may
// report counts near 2^64.
func SatAdd(a, b uint64) uint64 { return satAdd(a, b) }
