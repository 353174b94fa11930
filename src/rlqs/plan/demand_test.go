package plan

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// A change of demand is told from chance by the binomial odds of the new
// interval's part of both intervals' requests: exact for small counts,
// where reading each side's variance from its own count took 3 requests
// after 10 for a fall, and normal past maxExactCount.
func TestChangeIsToldFromChance(t *testing.T) {
	for _, tc := range []struct {
		name      string
		last, now rate
		want      int8
	}{
		{"steady", rate{100, 20}, rate{25, 5}, 0},
		{"2 a second, a low report by chance", rate{40, 20}, rate{3, 5}, 0},
		{"2 a second, a high report by chance", rate{40, 20}, rate{17, 5}, 0},
		{"2 a second, stopped", rate{40, 20}, rate{0, 5}, -1},
		{"10 in a report, then none", rate{10, 5}, rate{0, 5}, -1},
		{"10 in a report, then one: chance", rate{10, 5}, rate{1, 5}, 0},
		{"idle 20 s, then 1 a second", rate{0, 20}, rate{5, 5}, 1},
		{"idle 5 s, then 1 a second: chance", rate{0, 5}, rate{5, 5}, 0},
		{"large counts: 20 a second, then 12", rate{400, 20}, rate{60, 5}, -1},
		{"large counts: 20 a second, then 22", rate{400, 20}, rate{110, 5}, 0},
		{"large counts: 20 a second, then 40", rate{400, 20}, rate{200, 5}, 1},
		{"nothing at all", rate{0, 20}, rate{0, 5}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := changed(tc.last, tc.now); got != tc.want {
				t.Errorf("changed(%+v, %+v) = %d, want %d", tc.last, tc.now, got, tc.want)
			}
		})
	}
}

// binomialTails sums to the known odds, and stays finite where a term
// computed on its own would underflow.
func TestBinomialTails(t *testing.T) {
	for _, tc := range []struct {
		n, k         int
		p            float64
		below, above float64
	}{
		{10, 0, 0.5, 1.0 / 1024, 1},
		{10, 10, 0.5, 1, 1.0 / 1024},
		{10, 5, 0.5, 638.0 / 1024, 638.0 / 1024},
		{400, 0, 0.2, math.Pow(0.8, 400), 1},
		{400, 3, 0.5, 0, 1}, // far in a tail: below is tiny, not NaN
	} {
		below, above := binomialTails(tc.n, tc.k, tc.p)
		if math.Abs(below-tc.below) > 1e-9 || math.Abs(above-tc.above) > 1e-9 || math.IsNaN(below) {
			t.Errorf("binomialTails(%d, %d, %v) = %v, %v; want %v, %v", tc.n, tc.k, tc.p, below, above, tc.below, tc.above)
		}
	}
}

// Reports near 2^64 saturate the sum of a bucket's steady intervals, and
// the sum changed sets a report against, rather than wrap them to a small
// count (a client's report is any uint64).
func TestSteadySumsSaturate(t *testing.T) {
	var st steady
	st.add(rate{math.MaxUint64 - 1, 5})
	st.add(rate{10, 5})
	if got := st.rate(); got.n != math.MaxUint64 || got.secs != 10 {
		t.Errorf("steady rate %+v, want %d over 10 s", got, uint64(math.MaxUint64))
	}
	if got := changed(rate{math.MaxUint64 - 1, 20}, rate{10, 5}); got != -1 {
		t.Errorf("near 2^64 a report, then 10: changed %d, want -1 (a fall)", got)
	}
}

// A count within surelyChance standard deviations of the mean, which
// changed takes for chance without summing its odds, holds more than
// changeOdds in each tail, over trials up to maxExactCount and odds from
// 0.01 to 0.99.
func TestSurelyChanceIsChance(t *testing.T) {
	for n := 1; n <= maxExactCount; n += 3 {
		for p := 0.01; p <= 0.99; p += 0.02 {
			mean, sd := float64(n)*p, math.Sqrt(float64(n)*p*(1-p))
			for k := int(math.Ceil(mean - surelyChance*sd)); float64(k) <= mean+surelyChance*sd; k++ {
				if k < 0 || k > n || math.Abs(float64(k)-mean) >= surelyChance*sd {
					continue
				}
				if below, above := binomialTails(n, k, p); below < changeOdds || above < changeOdds {
					t.Fatalf("%d of %d trials of %.2f: tails %v and %v, within %v deviations", k, n, p, below, above, surelyChance)
				}
			}
		}
	}
}

// BenchmarkChanged is the cost of telling a report's change from chance,
// which noteUsage pays for every bucket of every report on the service's
// owner: a steady bucket of 2 a second (small counts, the exact
// odds' case), one of 20 a second, and one that stopped.
func BenchmarkChanged(b *testing.B) {
	for _, bc := range []struct {
		name      string
		last, now rate
	}{
		{"steady, 2 a second", rate{40, 20}, rate{10, 5}},
		{"steady, 20 a second", rate{400, 20}, rate{100, 5}},
		{"steady, 20 a second for 15 s: the most summed", rate{300, 15}, rate{100, 5}},
		{"steady, 60 a second", rate{300, 5}, rate{300, 5}},
		{"stopped, 2 a second", rate{40, 20}, rate{0, 5}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				changed(bc.last, bc.now)
			}
		})
	}
}

// observeFor feeds d a paced demand of rate a second, reported every
// interval for span, and calls each with the demand after every report
// past settle.
func observeFor(d *Demand, rate float64, interval, span, settle time.Duration, each func(float64)) {
	owed := 0.0
	for at := interval; at <= span; at += interval {
		owed += rate * interval.Seconds()
		n := uint64(owed)
		owed -= float64(n)
		d.Observe(n, interval)
		if at > settle {
			each(d.Rate())
		}
	}
}

// A light bucket's demand is read over steadySpan of its reports, however
// often it reports: a bucket of one request every 8 s reads as about that,
// never as idle, whether it reports every 1, 2, 5 or 10 s. Read over four
// reports, as before, a bucket reporting every second read as idle in
// most seconds, and was denied.
func TestDemandIsReadInTime(t *testing.T) {
	for _, interval := range []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second} {
		t.Run(interval.String(), func(t *testing.T) {
			d := NewDemand()
			lo, hi := math.Inf(1), 0.0
			observeFor(&d, 0.125, interval, 3*time.Minute, steadySpan, func(r float64) {
				lo, hi = math.Min(lo, r), math.Max(hi, r)
			})
			if lo < 0.05 || hi > 0.25 {
				t.Errorf("demand read %.3f to %.3f a second, want within 0.05 to 0.25 of a true 0.125", lo, hi)
			}
			if got := d.Interval(); got != interval {
				t.Errorf("interval learned %v, want %v", got, interval)
			}
		})
	}
}

// A light bucket's demand is read over as much as a minute of its reports,
// until they hold steadyCount requests, so that chance seldom reads it
// far under its rate: a bucket of 0.25 a second with Poisson arrivals,
// read over 20 s, read under half its rate after 0.09 (reports every 5 s)
// to 0.15 (every second) of its reports; over a minute, 0.01 to 0.03. A
// bucket whose 20 s hold steadyCount is read over those alone.
func TestALightDemandIsReadOverEnoughRequests(t *testing.T) {
	for _, interval := range []time.Duration{time.Second, 5 * time.Second} {
		t.Run(interval.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, 6))
			const rate = 0.25
			d := NewDemand()
			under, reads := 0, 0
			for at := interval; at <= 30*time.Minute; at += interval {
				d.Observe(poissonCount(rng, rate*interval.Seconds()), interval)
				if at > steadyLongSpan {
					reads++
					if d.Rate() < rate/2 {
						under++
					}
				}
			}
			if share := float64(under) / float64(reads); share > 0.05 {
				t.Errorf("read under half its rate in %.3f of %d reports, want at most 0.05", share, reads)
			}
			heavy := NewDemand()
			observeFor(&heavy, 2, interval, 2*time.Minute, 0, func(float64) {})
			if got, want := heavy.Noise(), math.Sqrt(40)/20; math.Abs(got-want) > 1e-9 {
				t.Errorf("a bucket of 2 a second: noise %v, want %v (read over 20 s, 40 requests)", got, want)
			}
		})
	}
}

// Demand that turns on and off every 5 s is taken as bursting, and keeps
// its peak through the lulls, whether the bucket reports every second or
// every 5 s: reports every second cannot follow it either, since each
// move costs a push and a delivery bound. Demand that came once and went
// is followed.
func TestBurstsAreToldFromMoves(t *testing.T) {
	for _, interval := range []time.Duration{time.Second, 5 * time.Second} {
		t.Run(interval.String(), func(t *testing.T) {
			d := NewDemand()
			d.Observe(0, interval) // measured, idle
			step := func(rate float64, span time.Duration) {
				observeFor(&d, rate, interval, span, span, func(float64) {})
			}
			for range 3 {
				step(20, 5*time.Second)
				step(0, 5*time.Second)
			}
			if got := d.Rate(); got < 19 {
				t.Errorf("bursting, in a lull: demand %.1f, want the peak, 20", got)
			}
			step(0, burstSpan+5*time.Second)
			if got := d.Rate(); got != 0 {
				t.Errorf("a burst span after the last burst: demand %.1f, want 0", got)
			}
			d = NewDemand()
			d.Observe(0, interval)
			step(20, 5*time.Second)
			step(0, 5*time.Second)
			if got := d.Rate(); got != 0 {
				t.Errorf("on once, then off: demand %.1f, want 0 (followed)", got)
			}
		})
	}
}
