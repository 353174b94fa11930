package integration

import (
	"flag"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/proto"

	"github.com/openrls/ratelimit/src/redis/redistest"
	"github.com/openrls/ratelimit/src/rlqs/rlqstest"
)

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
// a minute) a fleet of fake Envoys (Envoy 1.40's client, DENY_ALL before a
// first assignment, reporting at each interval of -rlqs.reports) uses under each demand pattern,
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

// rlqsReports is each fleet's report intervals, one fleet per column: a
// fleet of several intervals (5s+1s) has its Envoys report at each in
// turn, as a fleet mid-upgrade does.
var rlqsReports = flag.String("rlqs.reports", "5s,1s", "BenchmarkRLQSPatterns: the fleets' report intervals, comma-separated; a fleet of mixed intervals joins them with + (5s+1s)")

// reportFleets parses -rlqs.reports.
func reportFleets(b *testing.B) (names []string, fleets [][]time.Duration) {
	for _, name := range strings.Split(*rlqsReports, ",") {
		var fleet []time.Duration
		for _, part := range strings.Split(name, "+") {
			d, err := time.ParseDuration(strings.TrimSpace(part))
			if err != nil || d < time.Second {
				b.Fatalf("-rlqs.reports: %q is not an interval of a second or more", part)
			}
			fleet = append(fleet, d)
		}
		names, fleets = append(names, name), append(fleets, fleet)
	}
	return names, fleets
}

func BenchmarkRLQSPatterns(b *testing.B) {
	only := regexp.MustCompile(*rlqsPatternOnly)
	names, fleets := reportFleets(b)
	for _, store := range []string{"memory", "redis"} {
		for k, reports := range fleets {
			b.Run(store+"/reports "+names[k], func(b *testing.B) {
				rows := []string{"| pattern | worst window | used (settled) | demand admitted | furthest from fair share | used of what is left | ... furthest from its share of it | back to 90% of what is left after each change |", "|---|---|---|---|---|---|---|---|"}
				for _, pt := range rlqstest.Patterns() {
					if !only.MatchString(pt.Name) {
						continue
					}
					rows = append(rows, rlqsPatternRow(b, store, pt, reports))
					b.Log(rows[len(rows)-1])
				}
				fmt.Printf("RLQS patterns on %s, reports every %s, limit 30/s or 300/min:\n%s\n", store, names[k], strings.Join(rows, "\n"))
			})
		}
	}
}

func rlqsPatternRow(b *testing.B, store string, pt rlqstest.Pattern, reports []time.Duration) string {
	if pt.Replicas > 1 && store != "redis" {
		return fmt.Sprintf("| %s | replicas share Redis only | | | | | | |", pt.Name)
	}
	env := writeConfig(b, map[string]string{"quota.yaml": rlqsConfig + rlqsMinuteConfig})
	env["LOG_LEVEL"] = "warn"
	if store == "redis" {
		env["REDIS_URL"], env["BACKEND_TYPE"] = redistest.Start(b).Addr, "redis"
	}
	f := rlqstest.Fleet{Domain: "quota", Second: map[string]string{"tenant": "acme"}, Minute: map[string]string{"tenant": "minute"},
		Run: *rlqsPhase, Settle: 12 * time.Second, Minutes: *rlqsMinutes, Reports: reports}
	for range max(pt.Replicas, 1) {
		p := start(b, env)
		defer p.stop(b)
		f.Conns = append(f.Conns, p.conn)
	}
	begin := time.Now()
	if *rlqsTrace {
		f.OnMessage = func(i int, m proto.Message, at time.Time) {
			fmt.Printf("%6.2fs envoy %d %s\n", at.Sub(begin).Seconds(), i, brief(m))
		}
	}
	r := pt.Run(f)
	limit, window := pt.Window()
	if *rlqsTrace {
		traceWindows(r.Begin, window, r.Each)
	}
	if r.Last < r.First {
		return fmt.Sprintf("| %s | %d / %.0f | no whole window to read: run longer | | | | | |", pt.Name, r.Worst(), limit)
	}
	perSecond := limit / window.Seconds()
	furthest, which := r.Furthest(0)
	ofLeft := "-"
	if x, i := r.Furthest(1); i >= 0 {
		ofLeft = fmt.Sprintf("Envoy %d: %.2f", i, x)
	}
	admitted := "-"
	if d := pt.Demand(); d < perSecond {
		admitted = fmt.Sprintf("%.0f%%", 100*r.Used()*perSecond/d)
	}
	usedOfLeft := "nothing is left"
	if u := r.UsedOfLeft(); !math.IsNaN(u) {
		usedOfLeft = fmt.Sprintf("%.2f", u)
	}
	return fmt.Sprintf("| %s | %d / %.0f | %.0f%% | %s | Envoy %d (%.1f/s wanted): %.2f of its share | %s | %s | %s |", pt.Name, r.Worst(), limit,
		100*r.Used(), admitted, max(which, 0), pt.Demands[max(which, 0)], furthest, usedOfLeft, ofLeft, recoveries(r))
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

// recoveries says, for each change of demand from 10 s into a run, how
// long the windows took to be back at 90% of what is left; ">" when they
// were not before the next change.
func recoveries(r *rlqstest.Result) string {
	var out []string
	for _, c := range r.Recoveries() {
		took := fmt.Sprintf("%.1f s", c.Took.Seconds())
		if !c.Back {
			took = fmt.Sprintf("> %.0f s", c.Took.Seconds())
		}
		out = append(out, fmt.Sprintf("at %.0f s: %s", c.At.Seconds(), took))
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, "; ")
}
