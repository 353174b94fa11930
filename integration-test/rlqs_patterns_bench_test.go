package integration

import (
	"flag"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/proto"

	"github.com/openrls/ratelimit/src/redis/redistest"
	"github.com/openrls/ratelimit/src/rlqs/rlqstest"
)

// rlqsPattern is a fleet's demand: one rate per fake Envoy (requests per
// second), paced or with Poisson arrivals, on the limit of 30 a second or,
// perMinute, on one of 300 a minute.
type rlqsPattern struct {
	name      string
	demands   []float64
	poisson   bool
	perMinute bool
	// moves, when set, gives the demand to one Envoy at a time, the next
	// every moves (Envoy k of n from k×moves, then (n+k)×moves, ...).
	moves time.Duration
	// spans, when set, is when each Envoy has demand: from its first to
	// its second duration into the run (0: to the end).
	spans [][2]time.Duration
	// replicas is how many service processes share the store (more than
	// one: Redis only); Envoy i talks to replica i×replicas/n.
	replicas int
	// bursts, when set, turns each Envoy's demand on and off every
	// bursts, Envoy i of n a cycle's i/n later than Envoy 0.
	bursts time.Duration
}

var rlqsPatterns = []rlqsPattern{
	{"3 equal (20/s each)", []float64{20, 20, 20}, false, false, 0, nil, 1, 0},
	{"3 equal, Poisson", []float64{20, 20, 20}, true, false, 0, nil, 1, 0},
	{"1 heavy (40/s) + 9 light (1/s)", append([]float64{40}, 1, 1, 1, 1, 1, 1, 1, 1, 1), false, false, 0, nil, 1, 0},
	{"30 Envoys (2/s each)", func() []float64 {
		d := make([]float64, 30)
		for i := range d {
			d[i] = 2
		}
		return d
	}(), false, false, 0, nil, 1, 0},
	{"below the limit (3 x 5/s)", []float64{5, 5, 5}, false, false, 0, nil, 1, 0},
	{"demand moving to another Envoy every 10 s (40/s)", []float64{40, 40, 40}, false, false, 10 * time.Second, nil, 1, 0},
	{"an Envoy leaving at 15 s, another joining at 20 s (20/s each)", []float64{20, 20, 20}, false, false, 0,
		[][2]time.Duration{{0, 0}, {0, 15 * time.Second}, {20 * time.Second, 0}}, 1, 0},
	{"bursty: on 5 s, off 5 s, staggered (3 x 20/s)", []float64{20, 20, 20}, false, false, 0, nil, 1, 5 * time.Second},
	{"per minute: 5 equal (2/s each)", []float64{2, 2, 2, 2, 2}, false, true, 0, nil, 1, 0},
	{"per minute: 1 heavy (8/s) + 4 light (0.5/s)", []float64{8, 0.5, 0.5, 0.5, 0.5}, false, true, 0, nil, 1, 0},
	// Two replicas on one Redis: Envoys 0 and 1 on the first, 2 on the
	// second, which must take a third of the limit, not half.
	{"two replicas (Redis), 2 + 1 Envoys (20/s each)", []float64{20, 20, 20}, false, false, 0, nil, 2, 0},
}

// rlqsMinutes is how long a per-minute pattern runs: its first minute
// settles, the whole minutes after it are read.
var rlqsMinutes = flag.Duration("rlqs.minutes", 3*time.Minute, "BenchmarkRLQSPatterns: how long each per-minute pattern runs")

// rlqsMinuteConfig adds the per-minute limit beside rlqsConfig's.
const rlqsMinuteConfig = `
  - key: tenant
    value: minute
    rate_limit: {unit: minute, requests_per_unit: 300}
`

// BenchmarkRLQSPatterns measures how much of one limit (30 a second, or 300
// a minute) a fleet of fake Envoys (Envoy 1.40's client, reports every 5 s,
// DENY_ALL before a first assignment) uses under each demand pattern,
// through the binary on the embedded store and on Redis: the worst window
// against the limit, the share of the limit used once settled (per second:
// from 12 s to -rlqs.phase; per minute: the whole minutes after the first,
// within -rlqs.minutes), demand admitted where demand is under the limit,
// and the Envoy furthest from its max-min fair share (admitted over
// share): of the limit, and of what the protocol leaves of it (the limit
// less a token a window for each Envoy with demand), which the issue's
// goal is put on; and, where demand changes, how long each change took
// to be back at 90% of what is left. Loopback; each pattern runs
// -rlqs.phase or -rlqs.minutes; -rlqs.trace prints what happened.
//
//	go test ./integration-test -run '^$' -bench RLQSPatterns -benchtime 1x -args -rlqs.phase=30s
var rlqsPatternOnly = flag.String("rlqs.pattern", "", "BenchmarkRLQSPatterns: run only the patterns whose name matches this regular expression")

// rlqsTrace prints each window's admissions, and every report and
// response, per Envoy: where a pattern loses, and why.
var rlqsTrace = flag.Bool("rlqs.trace", false, "BenchmarkRLQSPatterns: print every window's admissions and every report and response, per Envoy")

func BenchmarkRLQSPatterns(b *testing.B) {
	only := regexp.MustCompile(*rlqsPatternOnly)
	for _, store := range []string{"memory", "redis"} {
		b.Run(store, func(b *testing.B) {
			rows := []string{"| pattern | worst window | used (settled) | demand admitted | furthest from fair share | ... of what is left | back to 90% of what is left after each change |", "|---|---|---|---|---|---|---|"}
			for _, pt := range rlqsPatterns {
				if !only.MatchString(pt.name) {
					continue
				}
				rows = append(rows, rlqsPatternRow(b, store, pt))
				b.Log(rows[len(rows)-1])
			}
			fmt.Println("RLQS patterns on " + store + ", limit 30/s or 300/min:\n" + strings.Join(rows, "\n"))
		})
	}
}

func rlqsPatternRow(b *testing.B, store string, pt rlqsPattern) string {
	limit, window, id := 30.0, time.Second, map[string]string{"tenant": "acme"}
	begin := time.Now()
	end, settleAt := begin.Add(*rlqsPhase), begin.Add(12*time.Second)
	if pt.perMinute {
		limit, window, id = 300, time.Minute, map[string]string{"tenant": "minute"}
		end = begin.Add(*rlqsMinutes)
		settleAt = begin.Truncate(time.Minute).Add(2 * time.Minute) // the first whole minute after the first
	}
	env := writeConfig(b, map[string]string{"quota.yaml": rlqsConfig + rlqsMinuteConfig})
	env["LOG_LEVEL"] = "warn"
	if store == "redis" {
		env["REDIS_URL"], env["BACKEND_TYPE"] = redistest.Start(b).Addr, "redis"
	}
	// Whole windows are read: from the first that starts at or after
	// settleAt to the last that ends by end.
	first := (settleAt.UnixNano() + int64(window) - 1) / int64(window)
	last := end.UnixNano()/int64(window) - 1
	if pt.replicas > 1 && store != "redis" {
		return fmt.Sprintf("| %s | replicas share Redis only | | | | |", pt.name)
	}
	procs := make([]*proc, pt.replicas)
	for r := range procs {
		procs[r] = start(b, env)
		defer procs[r].stop(b)
	}
	var mu sync.Mutex
	per := map[int64]int{}
	mine := make([]int, len(pt.demands))
	each := map[int64][]int{} // by window, per Envoy: -rlqs.trace
	var wg sync.WaitGroup
	for i, d := range pt.demands {
		p := procs[i*pt.replicas/len(pt.demands)]
		var onMessage func(proto.Message, time.Time)
		if *rlqsTrace {
			onMessage = func(m proto.Message, at time.Time) {
				fmt.Printf("%6.2fs envoy %d %s\n", at.Sub(begin).Seconds(), i, brief(m))
			}
		}
		e := rlqstest.Start(rlqstest.Options{Conn: p.conn, Domain: "quota", NoAssignment: rlqstest.Deny, OnMessage: onMessage,
			OnAdmit: func(_ string, at time.Time) {
				mu.Lock()
				defer mu.Unlock()
				w := at.UnixNano() / int64(window)
				per[w]++
				if *rlqsTrace {
					if each[w] == nil {
						each[w] = make([]int, len(pt.demands))
					}
					each[w][i]++
				}
				if w >= first && w <= last {
					mine[i]++
				}
			}})
		defer e.Stop()
		wg.Add(1)
		go func() {
			defer wg.Done()
			arrivals(d, pt.poisson, uint64(i), end, func() {
				if pt.active(i, begin, time.Now()) {
					e.Request(id)
				}
			})
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	traceWindows(begin, window, each)
	worst, used := 0, 0
	for w, n := range per {
		worst = max(worst, n)
		if w >= first && w <= last {
			used += n
		}
	}
	if last < first {
		return fmt.Sprintf("| %s | %d / %.0f | no whole window to read: run longer | | | |", pt.name, worst, limit)
	}
	demand := 0.0
	for _, d := range pt.demands {
		demand += d
	}
	span := float64(last-first+1) * window.Seconds() // seconds read
	perSecond := limit / window.Seconds()
	from, to := time.Unix(0, first*int64(window)), time.Unix(0, (last+1)*int64(window))
	furthest, which := furthestFrom(mine, span, pt.shares(perSecond, 0, begin, from, to))
	// The goal is put on what the protocol leaves: the limit less
	// a token a window for each Envoy with demand (each holds its token
	// bucket's window-start token).
	ofLeft := "-"
	if r, i := furthestFrom(mine, span, pt.shares(perSecond, 1/window.Seconds(), begin, from, to)); i >= 0 {
		ofLeft = fmt.Sprintf("Envoy %d: %.2f", i, r)
	}
	admitted := "-"
	if demand < perSecond {
		admitted = fmt.Sprintf("%.0f%%", 100*float64(used)/span/demand)
	}
	return fmt.Sprintf("| %s | %d / %.0f | %.0f%% | %s | Envoy %d (%.1f/s wanted): %.2f of its share | %s | %s |", pt.name, worst, limit,
		100*float64(used)/span/perSecond, admitted, max(which, 0), pt.demands[max(which, 0)], furthest, ofLeft, pt.recoveries(per, begin, end, perSecond))
}

// traceWindows prints each window's admissions per Envoy, in order, with
// the window's start into the run (to stdout: a benchmark's log keeps
// only its first lines).
func traceWindows(begin time.Time, window time.Duration, each map[int64][]int) {
	for _, w := range slices.Sorted(maps.Keys(each)) {
		fmt.Printf("%6.1fs %v\n", time.Unix(0, w*int64(window)).Sub(begin).Seconds(), each[w])
	}
}

// brief is a report's counts or a response's strategies, in a few words.
func brief(m proto.Message) string {
	var out []string
	switch m := m.(type) {
	case *rlqsv3.RateLimitQuotaUsageReports:
		for _, u := range m.GetBucketQuotaUsages() {
			out = append(out, fmt.Sprintf("report %d allowed, %d denied", u.GetNumRequestsAllowed(), u.GetNumRequestsDenied()))
		}
	case *rlqsv3.RateLimitQuotaResponse:
		for _, a := range m.GetBucketAction() {
			st := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
			if tb := st.GetTokenBucket(); tb != nil {
				out = append(out, fmt.Sprintf("gets %d tokens every %ds, capacity %d", tb.GetTokensPerFill().GetValue(), tb.GetFillInterval().GetSeconds(), tb.GetMaxTokens()))
			} else {
				out = append(out, "gets "+st.GetBlanketRule().String())
			}
		}
	}
	return strings.Join(out, "; ")
}

// recoveries says, for each change of demand from 10 s into a run (a move,
// an Envoy leaving or joining), how long the windows took to admit 90% of
// what is left (the limit less a token for each Envoy with demand, or the
// demand when it is below that), counted to the end of the first window
// that did; ">" when none did before the next change.
func (pt rlqsPattern) recoveries(per map[int64]int, begin, end time.Time, limit float64) string {
	var changes []time.Duration
	switch {
	case pt.moves > 0:
		for c := pt.moves; begin.Add(c).Before(end); c += pt.moves {
			changes = append(changes, c)
		}
	case pt.spans != nil:
		for _, sp := range pt.spans {
			for _, c := range sp {
				if c > 0 && begin.Add(c).Before(end) {
					changes = append(changes, c)
				}
			}
		}
		slices.Sort(changes)
	}
	var out []string
	for k, c := range changes {
		if c < 10*time.Second {
			continue
		}
		until := end
		if k+1 < len(changes) {
			until = begin.Add(changes[k+1])
		}
		at := begin.Add(c)
		took := fmt.Sprintf("> %.0f s", until.Sub(at).Seconds())
		for w := at.Truncate(time.Second); !w.Add(time.Second).After(until); w = w.Add(time.Second) {
			if w.Before(at) {
				continue
			}
			want, left := 0.0, limit
			for i, d := range pt.demands {
				if pt.active(i, begin, w) {
					want, left = want+d, left-1
				}
			}
			if float64(per[w.Unix()]) >= 0.9*math.Min(want, left) {
				took = fmt.Sprintf("%.1f s", w.Add(time.Second).Sub(at).Seconds())
				break
			}
		}
		out = append(out, fmt.Sprintf("at %.0f s: %s", c.Seconds(), took))
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, "; ")
}

// furthestFrom is the Envoy whose admissions (mine, over span seconds)
// are furthest from its share (per second), and their ratio; -1 when no
// Envoy has a share.
func furthestFrom(mine []int, span float64, shares []float64) (float64, int) {
	furthest, which := 1.0, -1
	for i, n := range mine {
		if r := float64(n) / span / shares[i]; shares[i] > 0 && (math.Abs(r-1) > math.Abs(furthest-1) || which < 0) {
			furthest, which = r, i
		}
	}
	return furthest, which
}

// active reports whether Envoy i has demand at t, in a run begun at begin.
func (pt rlqsPattern) active(i int, begin, t time.Time) bool {
	in := t.Sub(begin)
	if pt.bursts > 0 {
		cycle := 2 * pt.bursts
		return (in+cycle*time.Duration(i)/time.Duration(len(pt.demands)))%cycle < pt.bursts
	}
	if pt.spans != nil && (in < pt.spans[i][0] || pt.spans[i][1] > 0 && in >= pt.spans[i][1]) {
		return false
	}
	return pt.moves == 0 || int(in/pt.moves)%len(pt.demands) == i
}

// shares is each Envoy's max-min fair share of capacity (a second) less
// perEnvoy for each Envoy with demand, averaged over [from, to): where
// demand moves or Envoys come and go, the shares of those with demand at
// each instant.
func (pt rlqsPattern) shares(capacity, perEnvoy float64, begin, from, to time.Time) []float64 {
	if pt.moves == 0 && pt.spans == nil && pt.bursts == 0 {
		return maxMinShares(math.Max(capacity-perEnvoy*float64(len(pt.demands)), 0), pt.demands)
	}
	out := make([]float64, len(pt.demands))
	step := 10 * time.Millisecond
	n := 0
	now := make([]float64, len(pt.demands))
	for t := from; t.Before(to); t = t.Add(step) {
		n++
		active := 0
		for i, d := range pt.demands {
			now[i] = 0
			if pt.active(i, begin, t) {
				now[i] = d
				active++
			}
		}
		for i, u := range maxMinShares(math.Max(capacity-perEnvoy*float64(active), 0), now) {
			out[i] += u
		}
	}
	for i := range out {
		out[i] /= float64(n)
	}
	return out
}

// arrivals calls fn at rate a second until end: paced, or with Poisson
// arrivals (exponential gaps, seeded); bounded by rate × the span × 3.
func arrivals(rate float64, poisson bool, seed uint64, end time.Time, fn func()) {
	rng := rand.New(rand.NewPCG(seed, 11))
	bound := int(rate*time.Until(end).Seconds())*3 + 3
	next := time.Now()
	for n := 0; n < bound; n++ {
		gap := time.Duration(float64(time.Second) / rate)
		if poisson {
			gap = time.Duration(rng.ExpFloat64() * float64(time.Second) / rate)
		}
		next = next.Add(gap)
		if next.After(end) {
			return
		}
		time.Sleep(time.Until(next))
		fn()
	}
}

// maxMinShares is each demand's max-min fair share of capacity.
func maxMinShares(capacity float64, demands []float64) []float64 {
	out := make([]float64, len(demands))
	order := make([]int, len(demands))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return demands[order[a]] < demands[order[b]] })
	left := capacity
	for k, i := range order {
		level := left / float64(len(order)-k)
		out[i] = math.Min(demands[i], level)
		left -= out[i]
	}
	return out
}
