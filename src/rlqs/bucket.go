package rlqs

import (
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
)

// kind is what a bucket is answered.
type kind uint8

const (
	kindNone      kind = iota // nothing sent yet
	kindAllow                 // ALLOW_ALL: unlimited
	kindUnmatched             // ALLOW_ALL: no rule (or an unknown domain)
	kindShadow                // ALLOW_ALL: shadow or quota mode, usage counted in metrics
	kindDeny                  // DENY_ALL: a limit of 0
	kindLimited               // a token bucket from the limit's pools
)

var kindNames = [...]string{"none", "allow_all", "unmatched", "shadow", "deny_all", "token_bucket"}

func (k kind) String() string { return kindNames[k] }

// bucket is one bucket id of one stream.
type bucket struct {
	s       *stream
	id      *rlqsv3.BucketId // as reported, echoed in every action
	idBytes int              // its keys' and values' bytes
	values  map[string]string
	cfg     *config.Config // the config kind and members come from
	kind    kind
	// members are the bucket's shares, one per limit of its rule.
	members []*member

	demand  float64 // requests per second; +Inf until measured
	counted uint64  // requests reported since lastReport
	// steady holds the report intervals since demand last changed past
	// chance, which the next is set against (see trend); swings follows
	// its changes.
	steady      steady
	swings      swings
	lastReport  time.Time
	lastTraffic time.Time
	gone        bool
	lending     bool // in the service's lenders, for the next round

	// What the Envoy was last sent.
	sent     time.Time
	sentKind kind
	sentQ    uint32
	sentF    int64
	sentCap  uint64
	// lapsed is set when an assignment may not have arrived: the next token
	// bucket may find the Envoy's bucket expired, and so start full.
	lapsed bool
}

// member is a bucket's share of one limit.
type member struct {
	b      *bucket
	p      *pool
	l      *ledger
	target float64 // tokens per second, from the pool's last fill
	// holds is whether the last fill gave it a share: a token bucket of
	// target, and the 0.9 of a token per period every grant carries (see
	// fillPeriods), which a target of 0 still has.
	holds  bool
	served int // the rounds that sent it a token bucket
	// burst is the capacity its pool's room to spare pays for (see
	// planBursts), in force from this fill; nextBurst the next fill's.
	burst, nextBurst uint64
}

// pool is one limit's counter, shared by every bucket (of every stream on
// this replica) that maps onto it.
type pool struct {
	key     string       // the rule's counter key; limiter.WindowKey names its windows
	rule    limiter.Rule // a fixed window, as reservations count
	metric  string
	members map[*member]struct{}
	// frac is this replica's part of the limit, by its part of the demand
	// all replicas published (exchangeDemand); 1 until known.
	frac float64
	// published is what this replica added to the pool's demand counters
	// of its last two push windows, the older first.
	published [2]published
}

// published is what a replica added to one push window's demand counter.
type published struct {
	w int64
	n uint64
}

// bucketKey is a canonical string of an unordered bucket id.
func bucketKey(values map[string]string) string {
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(strconv.Itoa(len(k)))
		b.WriteByte(':')
		b.WriteString(k)
		b.WriteString(strconv.Itoa(len(values[k])))
		b.WriteByte(':')
		b.WriteString(values[k])
	}
	return b.String()
}

// classify plans the bucket's request on cfg and says what it gets: its
// kind and, for a limited bucket, one reservation pool per limit (the
// rule's counter key, and the rule as a fixed window of its limit per
// period). Reservations are counted window by window, on
// limiter.WindowKey's names: a reservation made ahead for a later window
// must not end the current one, which a key holding one window would. RLS
// hits share those counters only under RLQS_SHARED_COUNTERS.
func classify(cfg *config.Config, domain string, values map[string]string) (kind, []poolSpec) {
	p, err := cfg.PlanBucket(domain, values)
	if err != nil {
		return kindUnmatched, nil
	}
	defer p.Release()
	if p.Domain == nil || len(p.Descs) == 0 {
		return kindUnmatched, nil
	}
	d := &p.Descs[0]
	switch {
	case d.Node == nil:
		return kindUnmatched, nil
	case d.Count == 0 && d.Unlimited:
		return kindAllow, nil
	case d.Count == 0:
		return kindUnmatched, nil
	case d.Shadow() || d.Quota():
		return kindShadow, nil
	}
	specs := make([]poolSpec, 0, d.Count)
	for i := d.First; i < d.First+d.Count; i++ {
		h := p.Hits[i]
		if h.Rule.Limit == 0 {
			return kindDeny, nil
		}
		specs = append(specs, poolSpec{key: h.Key, metric: p.Refs[i].Limit.MetricKey,
			rule: limiter.Rule{Algorithm: limiter.FixedWindow, Limit: h.Rule.Limit, Period: h.Rule.Period}})
	}
	return kindLimited, specs
}

type poolSpec struct {
	key, metric string
	rule        limiter.Rule
}

// reported is a report's requests, allowed and denied: a sum that
// saturates, since a client may report numbers near 2^64.
func reported(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) uint64 {
	return satAdd(u.GetNumRequestsAllowed(), u.GetNumRequestsDenied())
}

// satAdd is a+b, or the largest uint64 where that wraps.
func satAdd(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}

// noteUsage takes one report of the bucket's usage, received at now, and
// reports whether its demand was measured for the first time or fell past
// chance (see trend): its share then frees room, worth a round at once.
// A rise waits for the next push: the room it needs is mostly held by
// others until their falls hand it over, and answered at once it cost
// 100 Envoys on one limit 2.56 store calls a report instead of 1.59
// (BenchmarkRLQS).
func (b *bucket) noteUsage(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, now time.Time) (changed bool) {
	n := reported(u)
	b.counted = satAdd(b.counted, n)
	if n > 0 {
		b.lastTraffic = now
	}
	// Envoy's time_elapsed is whole seconds and 0 on a new bucket: the
	// server's own clock measures. Reports closer than a second apart (a
	// reconnect's) are summed into the next.
	if dt := now.Sub(b.lastReport); dt >= time.Second {
		r := rate{n: b.counted, secs: dt.Seconds()}
		d, dir := trend(b.steady.rate(), r)
		if dir != 0 {
			b.steady = steady{}
		}
		b.steady.add(r)
		if dir == 0 {
			d = b.steady.rate().perSecond()
		}
		d = b.swings.note(dir, r.perSecond(), d)
		changed = dir < 0 || math.IsInf(b.demand, 1)
		b.demand, b.counted, b.lastReport = d, 0, now
	}
	return changed
}

// swings tells bursts from moves. Demand that turns on and off about as
// often as Envoy reports (every 5 s) shows in each report as the phase
// before it, so shares that follow reports are always the wrong way
// round: 3 Envoys bursting 5 s on and 5 s off used 11-13% of the limit.
// A bucket whose demand changed past chance one way, then the other, then
// back, each within burstReports reports of the last, is taken as
// bursting: for burstReports reports after, its demand is the highest
// rate it reported in that span, so it keeps a share through its lulls.
// Demand that comes and goes once (it moved to the bucket, then away) is
// followed at once (see trend): one turn back is not a burst.
type swings struct {
	lastDir int8                  // the last change's direction: +1, -1, 0 for none yet
	since   int                   // reports since that change
	turns   int                   // changes in a row that turned back
	left    int                   // reports left of bursting
	rates   [burstReports]float64 // the last reports' rates, newest first
}

// burstReports is the span, in reports, that a swing back must come in
// for a bucket to be taken as bursting, and how long it stays so.
const burstReports = 3

// note takes one report's change of direction dir (see trend), its rate
// r and the demand d trend made of it, and returns the demand.
func (sw *swings) note(dir int8, r, d float64) float64 {
	copy(sw.rates[1:], sw.rates[:])
	sw.rates[0] = r
	sw.since++
	if sw.left > 0 {
		sw.left--
	}
	if dir != 0 {
		if sw.lastDir == -dir && sw.since <= burstReports {
			sw.turns++
		} else {
			sw.turns = 0
		}
		if sw.turns >= 2 {
			sw.left = burstReports
		}
		sw.lastDir, sw.since = dir, 0
	}
	if sw.left == 0 {
		return d
	}
	for _, p := range sw.rates {
		d = math.Max(d, p)
	}
	return d
}

// steady is a bucket's last report intervals, up to steadyReports, since
// its demand last changed past chance: demand is their rate, not the last
// one's alone. Read from one report, a paced light bucket of 0.5 a second
// reported 2 and 3 requests in turn, and its grant swung between 0.45 and
// 0.67 a second with it: short in every other interval, and every change
// of grant cost its Envoy the fraction of a token Envoy floors away on a
// replacement (1 heavy and 4 light Envoys on 300 a minute used 0.88 of
// what is left). Set against several, a change is told from chance
// sooner, too.
type steady struct {
	rates [steadyReports]rate // newest first
	n     int
}

// steadyReports bounds how far back demand is read: 20 s of Envoy 1.40's
// reports, so that a drift below chance is followed within that.
const steadyReports = 4

func (s *steady) add(r rate) {
	copy(s.rates[1:], s.rates[:])
	s.rates[0] = r
	s.n = min(s.n+1, steadyReports)
}

// rate is the intervals' requests over their time (zero time when none).
func (s *steady) rate() rate {
	var sum rate
	for _, r := range s.rates[:s.n] {
		sum.n, sum.secs = satAdd(sum.n, r.n), sum.secs+r.secs
	}
	return sum
}

// rate is requests counted over an interval.
type rate struct {
	n    uint64
	secs float64 // 0: none measured
}

func (r rate) perSecond() float64 { return float64(r.n) / r.secs }

// trend is the demand that report interval now measures after the ones
// before it (last): its rate, or, where the two differ by more than
// chance would make, the rate carried on by the change (a fall no lower
// than half the rate measured).
//
// Demand that moves mid-interval shows in part in each side's report: an
// Envoy whose traffic stopped two seconds in still reports 40% of its old
// rate, and one whose traffic began then reports 60% of its new one. Read
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
// of 10,000 buckets tens of milliseconds under the service's lock.
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

// held is the grant in force for the member's limit, in tokens per
// period: what its bucket was last sent, when that is a token bucket of
// this limit's period still in force; else 0.
func (m *member) held() float64 {
	b := m.b
	if b.sentKind != kindLimited || b.lapsed || time.Duration(b.sentF)*time.Second != m.p.rule.Period {
		return 0
	}
	return float64(b.sentQ)
}

// want is the demand a pool's fill sees: what was measured, with room to
// grow by a tenth, so a bucket whose traffic rises shows it (as denials)
// and gets more on the next fill; and at least a token per period (a
// fill sees what it wants past the 0.9 every grant refills besides, in
// whole tokens: see wantPast). Room of a whole request per period besides, as
// before, gave each light bucket twice its demand on a per-second limit,
// which the heavy one then lacked (nine buckets of 1/s beside one of 40/s
// on 30/s: the heavy one got 2/s where max-min gives it 21).
func (m *member) want() float64 {
	if math.IsInf(m.b.demand, 1) || m.b.demand == 0 {
		// Unmeasured: an even share. Idle: nothing, so that its
		// window-start tokens go to the busy; a request it then denies
		// shows in its next report.
		return m.b.demand
	}
	return max(m.b.demand*1.1, 1/m.p.rule.Period.Seconds())
}
