package integration

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/redis/redistest"
	"github.com/openrls/ratelimit/src/rlqs/rlqstest"
)

// rlqsPattern is a fleet's demand: one rate per fake Envoy (requests per
// second), paced or with Poisson arrivals.
type rlqsPattern struct {
	name    string
	demands []float64
	poisson bool
}

var rlqsPatterns = []rlqsPattern{
	{"3 equal (20/s each)", []float64{20, 20, 20}, false},
	{"3 equal, Poisson", []float64{20, 20, 20}, true},
	{"1 heavy (40/s) + 9 light (1/s)", append([]float64{40}, 1, 1, 1, 1, 1, 1, 1, 1, 1), false},
	{"30 Envoys (2/s each)", func() []float64 {
		d := make([]float64, 30)
		for i := range d {
			d[i] = 2
		}
		return d
	}(), false},
	{"below the limit (3 x 5/s)", []float64{5, 5, 5}, false},
}

// BenchmarkRLQSPatterns measures how much of one limit (30 a second) a fleet
// of fake Envoys (Envoy 1.40's client, reports every 5 s, DENY_ALL before a
// first assignment) uses under each demand pattern, through the binary on
// the embedded store and on Redis: the worst second against the limit, the
// share of the limit used once settled (from 12 s to -rlqs.phase), demand
// admitted where demand is under the limit, and the Envoy furthest from its
// max-min fair share (admitted over share). Loopback; each pattern runs
// -rlqs.phase.
//
//	go test ./integration-test -run '^$' -bench RLQSPatterns -benchtime 1x -args -rlqs.phase=30s
var rlqsPatternOnly = flag.String("rlqs.pattern", "", "BenchmarkRLQSPatterns: run only the patterns whose name matches this regular expression")

func BenchmarkRLQSPatterns(b *testing.B) {
	only := regexp.MustCompile(*rlqsPatternOnly)
	for _, store := range []string{"memory", "redis"} {
		b.Run(store, func(b *testing.B) {
			rows := []string{"| pattern | worst second | used (settled) | demand admitted | furthest from fair share |", "|---|---|---|---|---|"}
			for _, pt := range rlqsPatterns {
				if !only.MatchString(pt.name) {
					continue
				}
				rows = append(rows, rlqsPatternRow(b, store, pt))
				b.Log(rows[len(rows)-1])
			}
			fmt.Println("RLQS patterns on " + store + ", limit 30/s:\n" + strings.Join(rows, "\n"))
		})
	}
}

func rlqsPatternRow(b *testing.B, store string, pt rlqsPattern) string {
	const limit = 30
	env := writeConfig(b, map[string]string{"quota.yaml": rlqsConfig})
	env["LOG_LEVEL"] = "warn"
	if store == "redis" {
		env["REDIS_URL"], env["BACKEND_TYPE"] = redistest.Start(b).Addr, "redis"
	}
	p := start(b, env)
	defer p.stop(b)
	id := map[string]string{"tenant": "acme"}
	begin := time.Now()
	end := begin.Add(*rlqsPhase)
	settleAt := begin.Add(12 * time.Second)
	var mu sync.Mutex
	per := map[int64]int{}
	mine := make([]int, len(pt.demands))
	var wg sync.WaitGroup
	for i, d := range pt.demands {
		e := rlqstest.Start(rlqstest.Options{Conn: p.conn, Domain: "quota", NoAssignment: rlqstest.Deny,
			OnAdmit: func(_ string, at time.Time) {
				mu.Lock()
				defer mu.Unlock()
				per[at.Unix()]++
				if !at.Before(settleAt) && at.Before(end) {
					mine[i]++
				}
			}})
		defer e.Stop()
		wg.Add(1)
		go func() {
			defer wg.Done()
			arrivals(d, pt.poisson, uint64(i), end, func() { e.Request(id) })
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	worst, used, secs := 0, 0, 0
	for s, n := range per {
		worst = max(worst, n)
		if s >= settleAt.Unix() && s < end.Unix() {
			used, secs = used+n, secs+1
		}
	}
	demand := 0.0
	for _, d := range pt.demands {
		demand += d
	}
	span := float64(secs)
	shares := maxMinShares(limit, pt.demands)
	furthest, which := 1.0, 0
	for i, n := range mine {
		if r := float64(n) / span / shares[i]; math.Abs(r-1) > math.Abs(furthest-1) || i == 0 {
			furthest, which = r, i
		}
	}
	admitted := "-"
	if demand < limit {
		admitted = fmt.Sprintf("%.0f%%", 100*float64(used)/span/demand)
	}
	return fmt.Sprintf("| %s | %d / %d | %.0f%% | %s | Envoy %d (%.1f/s wanted): %.2f of its share |", pt.name, worst, limit,
		100*float64(used)/span/limit, admitted, which, pt.demands[which], furthest)
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
