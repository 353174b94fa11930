package plan

import "math"

// trend is the demand that report interval now measures after the ones
// before it (last): its rate, or, where the two differ by more than
// chance would make, the rate carried on by the change (a fall no lower
// than half the rate measured).
//
// Demand that moves mid-interval shows in part in each side's report: an
// Envoy whose traffic stopped two seconds in still reports two fifths of its old
// rate, and one whose traffic began then reports three fifths of its new one. Read
// as they were, the first kept a share it no longer used, and the second
// lacked one, until their next reports, 5 s later (Envoy 1.40's interval).
// Carried on, a rise that falls mid-interval is read in full at once: a
// step halfway is exact, an earlier one is read short, a later one
// overshoots, and the next report, steady again, corrects it. A fall is
// carried on only to half the rate measured: carried to nothing, a bucket
// whose traffic fell but did not stop would be denied until its next
// report. Chance: see changed. Below it, a steady bucket's shares would
// churn with its noise, and each new token bucket costs the Envoy the
// tokens it rescales away. It reports the direction of the change it
// took: +1 a rise, -1 a fall, 0 none.
func trend(last, now rate) (float64, int8) {
	r := now.perSecond()
	if last.secs == 0 {
		return r, 0
	}
	prev := last.perSecond()
	switch changed(last, now) {
	case 0:
		return r, 0
	case 1:
		return 2*r - prev, 1
	}
	return math.Max(2*r-prev, r/2), -1
}

// changed tells whether the requests of interval now differ from those
// of last by more than chance: +1 more, -1 fewer, 0 within it. Counts of
// independent requests are Poisson's; given both intervals' sum, now's
// part of it is binomial (with the intervals' share of the time as its
// odds) when the rate did not change, and a part in a tail of it past
// changeOdds is taken as a change. Exact for small counts: a normal
// approximation of the difference, with each side's variance read from
// its own count, took 3 requests in 5 s after 10 a report for a fall (its
// count's small variance made it look sure), and a bucket of 2 a second
// with Poisson arrivals was cut to a third of that for a report interval
// every few; and it missed a bucket of 1 a second starting after 20 s
// idle. Past maxExactCount the approximation is close.
func changed(last, now rate) int8 {
	total := satAdd(last.n, now.n)
	if total == 0 || now.secs <= 0 {
		return 0
	}
	p := now.secs / (last.secs + now.secs)
	if p >= 1 {
		return 0
	}
	mean, sd := float64(total)*p, math.Sqrt(float64(total)*p*(1-p))
	z := (float64(now.n) - mean) / sd
	switch {
	case math.Abs(z) < surelyChance && p >= 0.01 && p <= 0.99:
		return 0 // the common case, without summing the odds
	case total <= maxExactCount:
	case z > changeSigmas:
		return 1
	case z < -changeSigmas:
		return -1
	default:
		return 0
	}
	below, above := binomialTails(int(total), int(now.n), p)
	switch {
	case above < changeOdds:
		return 1
	case below < changeOdds:
		return -1
	}
	return 0
}

// changeSigmas and changeOdds are how far in a tail a count must be to be
// taken as a change: three standard deviations, 1 in 741 on each side (1
// report in 370 of a steady bucket).
const (
	changeSigmas  = 3
	changeOdds    = 0.00135
	maxExactCount = 400
)

// surelyChance is how near the mean, in standard deviations, a count is
// chance without summing its odds: within 2.5 of them, every binomial
// tail of up to maxExactCount trials with odds from 0.01 to 0.99 holds
// more than changeOdds (the least, 0.0021, at 306 trials of 0.98), so 2
// leaves room. Summed for every steady bucket, the odds cost a report
// of 10,000 buckets tens of milliseconds of the owner's time, which
// every other report and round waits for.
const surelyChance = 2

// binomialTails are P(X ≤ k) and P(X ≥ k) for X binomial with n trials of
// odds p (0 < p < 1), summed up to k in logarithms (no term underflows
// before it matters): O(k), a few microseconds a report.
func binomialTails(n, k int, p float64) (below, above float64) {
	lp, lq := math.Log(p), math.Log1p(-p)
	l := float64(n) * lq // log P(X = 0)
	pmf := 0.0
	for i := 0; i <= k; i++ {
		if i > 0 {
			l += math.Log(float64(n-i+1)) - math.Log(float64(i)) + lp - lq
		}
		pmf = math.Exp(l)
		below += pmf
	}
	return below, math.Max(1-below+pmf, 0)
}
