package rlqs_test

import (
	"context"
	"io"
	"math"
	"net"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/rlqs"
	"github.com/openrls/ratelimit/src/rlqs/rlqstest"
)

// patternConfig holds the patterns' limits: fleetConfig's 30 a second,
// and 300 a minute.
const patternConfig = fleetConfig + `
  - key: tenant
    value: minute
    rate_limit: {unit: minute, requests_per_unit: 300}
`

// fleetOf is the clients of a fleet: each Envoy reports at reports[i mod
// len] and plays profiles[i mod len] (unset: every 5 s, Envoy 1.40).
type fleetOf struct {
	reports  []time.Duration
	profiles []rlqstest.Profile
}

// runFleet runs pt with the fleet's clients fl in a synctest bubble: its replicas are Services on
// one embedded store, each with the settings' defaults, served over an
// in-memory gRPC connection (BenchmarkRLQSPatterns runs the same patterns
// through the binary, as cmd/server wires it), and its fake Envoys
// are fl's clients. Time in the bubble is virtual, so the run is the same on
// an idle machine and a busy one, and 8 virtual minutes take a moment. A
// per-minute pattern is read over its last 6 minutes: a bucket of 0.25 a
// second counts 15 requests a minute, and the least served of 8 such
// read over one minute was mostly the luck of that minute (each bucket's
// part admitted moves by about a tenth, one standard deviation, from one
// minute to the next).
// The run starts start into the bubble's clock, which is at a minute's start.
func runFleet(t *testing.T, pt rlqstest.Pattern, start time.Duration, fl fleetOf) *rlqstest.Result {
	var r *rlqstest.Result
	synctest.Test(t, func(t *testing.T) {
		time.Sleep(start)
		store := limiter.NewMemoryStore(limiter.MemoryOptions{})
		defer store.Close()
		f := rlqstest.Fleet{Domain: "fleet", Second: map[string]string{"tenant": "a"}, Minute: map[string]string{"tenant": "minute"},
			Run: 30 * time.Second, Settle: 12 * time.Second, Minutes: 8 * time.Minute, Reports: fl.reports, Profiles: fl.profiles}
		cfg := load(t, patternConfig)
		for range max(pt.Replicas, 1) {
			conn, stop := serveInMemory(t, rlqs.Options{Store: store, Configs: cfg})
			defer stop()
			f.Conns = append(f.Conns, conn)
		}
		r = pt.Run(f)
	})
	return r
}

// serveInMemory serves a Service over an in-memory listener and returns a
// connection to it, and what stops both.
func serveInMemory(t *testing.T, o rlqs.Options) (*grpc.ClientConn, func()) {
	t.Helper()
	log := logrus.New()
	log.SetOutput(io.Discard)
	o.Logger = log
	svc := rlqs.New(o)
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	rlqsv3.RegisterRateLimitQuotaServiceServer(gs, svc)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _ = gs.Serve(lis) }()
	go svc.Run(ctx)
	conn, err := grpc.NewClient("passthrough:///rlqs", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	return conn, func() {
		cancel()
		conn.Close()
		gs.Stop()
	}
}

// patternGoal is what TestFleetPatterns holds a pattern to, on average
// over runs at several starts within a second (and in every run, every
// pattern: never past the limit in any window). A run's figures move by
// several points with its phase against the windows and the pushes, and
// with which of the goroutines due at one virtual instant runs first.
type patternGoal struct {
	// ofLeft is the least share of what is left (UsedOfLeft) the windows
	// read admit; of the limit (Used) where nothing is left.
	ofLeft float64
	// fair is the least the Envoy served least gets of its max-min fair
	// share of what is left (of the limit where nothing is left).
	fair float64
	// short, when set, says how the pattern falls short of the issue's
	// goal (90% of what is left, each Envoy within 20% of its share,
	// back within two report intervals after a change): ofLeft and fair
	// are then a little below this build's level, kept, not the goal.
	short string
	// recovers are the changes of demand (into the run) that every run
	// must be back from at 90% of what is left within two report
	// intervals, as the goal asks.
	recovers []time.Duration
	// evenly, when set, is the least each Envoy must be admitted of the
	// fleet's mean per Envoy, on average (the most: 2 - evenly): with
	// more Envoys than the limit has room for, shares rotate fairly.
	evenly float64
}

// patternGoals, by pattern name. The goal: 0.9 of what is left, each
// Envoy at least 0.8 of its share (and the most served at most 1.2).
var patternGoals = map[string]patternGoal{
	"3 equal (20/s each)":            {ofLeft: 0.9, fair: 0.8},
	"3 equal, Poisson":               {ofLeft: 0.9, fair: 0.8},
	"1 heavy (40/s) + 9 light (1/s)": {ofLeft: 0.9, fair: 0.8},
	// The goal here is all the demand; a run that starts late in a second
	// loses a request or two in its first windows read.
	"below the limit (3 x 5/s)": {ofLeft: 0.97, fair: 0.95},
	"1 heavy + 9 light, Poisson": {ofLeft: 0.72, fair: 0.52,
		short: "a light bucket of 1 a second holds a token or two at a time, which Poisson arrivals find empty"},
	"below the limit, Poisson":                       {ofLeft: 0.9, fair: 0.8},
	"per minute: 5 equal, Poisson":                   {ofLeft: 0.9, fair: 0.8},
	"per minute: below the limit, Poisson (4 x 1/s)": {ofLeft: 0.9, fair: 0.8},
	"two replicas, 2 + 1 Envoys (20/s each)":         {ofLeft: 0.9, fair: 0.8},
	"demand moving to another Envoy every 10 s (40/s)": {ofLeft: 0.56, fair: 0.48,
		short:    "a move shows at the next report of the Envoy it goes to, up to 5 s later",
		recovers: []time.Duration{10 * time.Second, 20 * time.Second}},
	"an Envoy leaving at 15 s, another joining at 20 s (20/s each)": {ofLeft: 0.83, fair: 0.78,
		short:    "a leaving Envoy's idleness shows at its next report",
		recovers: []time.Duration{20 * time.Second}},
	"an Envoy leaving at 15 s (3 x 20/s)": {ofLeft: 0.82, fair: 0.8,
		short:    "back within two report intervals, as the goal asks, but the leaver's room stays held until its next report",
		recovers: []time.Duration{15 * time.Second}},
	"bursty: on 5 s, off 5 s, staggered (3 x 20/s)": {ofLeft: 0.3, fair: 0.26,
		short: "demand that turns on and off as often as Envoy reports can be kept, not followed"},
	"30 Envoys (2/s each)": {ofLeft: 0.6, fair: 0.5, evenly: 0.8,
		short: "nothing is left by the goal's measure (30 window-start tokens for 30 Envoys): shares rotate, evenly"},
	"per minute: 5 equal (2/s each)":              {ofLeft: 0.9, fair: 0.8},
	"per minute: 1 heavy (8/s) + 4 light (0.5/s)": {ofLeft: 0.9, fair: 0.8},
	"per minute: 2 x 4/s + 8 x 1/s, Poisson":      {ofLeft: 0.9, fair: 0.8},
	"per minute: 2 x 4/s + 8 x 0.25/s, Poisson": {ofLeft: 0.86, fair: 0.68,
		short: "a bucket of 0.25 a second with Poisson arrivals, read from few requests and held in a token bucket of capacity 2, denies some of them even with room for chance; what it leaves goes to the heavy ones (overbooked), so use is near the goal, fairness short of it"},
	"1 heavy (20/s) + 4 light (2/s), Poisson": {ofLeft: 0.72, fair: 0.4,
		short: "no token buckets can: 0.8 of each share costs more than the limit (TestLightPoissonBucketsCostMoreThanTheirShare)"},
}

// patternStarts is how many runs a pattern gets, starting k/patternStarts
// of its window into the bubble's clock (a minute's, per minute: arrivals
// are seeded, so starts within one second of a minute read nearly the
// same requests in the same windows: per minute below the limit with
// Poisson arrivals once read 0.96 of what is left started at the minute's
// start, and 0.79 started 55 s into it).
const patternStarts = 6

// intervals are the fleets TestFleetPatterns runs every pattern with: every
// Envoy reporting every 5 s (Envoy 1.40, and 1.41's default), every 2 s,
// every second (1.41's reporting_interval at its shortest), a fleet
// mid-upgrade, every other Envoy at 5 s and at 1 s, gRPC clients (gRFC
// A77: each bucket on its own timer) at 1 s, and all three in turn.
var intervals = []struct {
	name  string
	fleet fleetOf
}{
	{"5s", fleetOf{}},
	{"2s", fleetOf{reports: []time.Duration{2 * time.Second}}},
	{"1s", fleetOf{reports: []time.Duration{time.Second}}},
	{"mixed 5s and 1s", fleetOf{reports: []time.Duration{5 * time.Second, time.Second}}},
	{"gRPC at 1s", fleetOf{reports: []time.Duration{time.Second}, profiles: []rlqstest.Profile{rlqstest.GRPC}}},
	{"Envoy 1.40, Envoy at 1s and gRPC at 1s", fleetOf{reports: []time.Duration{5 * time.Second, time.Second, time.Second},
		profiles: []rlqstest.Profile{rlqstest.Envoy140, rlqstest.Envoy140, rlqstest.GRPC}}},
}

// shorterSlack is how far below its use at 5 s a pattern may fall at a
// shorter interval: a run's figures move by a point or two with its phase
// against the windows and the pushes.
const shorterSlack = 0.03

// TestFleetPatterns runs every demand pattern of the RLQS goal in virtual
// time, at several starts within a second, with every fleet of intervals,
// and holds each to patternGoals at every interval; a pattern that falls
// short of the goal (a goal with short) must do at least as well at a
// shorter interval as at 5 s.
func TestFleetPatterns(t *testing.T) {
	names := map[string]bool{}
	for _, pt := range rlqstest.Patterns() {
		names[pt.Name] = true
	}
	for name := range patternGoals {
		if !names[name] {
			t.Errorf("a goal for %q, which is no pattern", name)
		}
	}
	for _, pt := range rlqstest.Patterns() {
		g, ok := patternGoals[pt.Name]
		if !ok {
			t.Fatalf("pattern %q has no goal", pt.Name)
		}
		t.Run(pt.Name, func(t *testing.T) {
			t.Parallel()
			at5 := 0.0
			for _, iv := range intervals {
				if raceBuild && iv.name != "5s" {
					continue // see raceBuild
				}
				used := checkPattern(t, pt, g, iv.name, iv.fleet)
				switch {
				case iv.name == "5s":
					at5 = used
				case g.short != "" && used < at5-shorterSlack:
					t.Errorf("%s: %.3f used, below the %.3f at 5 s", iv.name, used, at5)
				}
			}
		})
	}
}

// checkPattern runs pt at patternStarts starts with the fleet's clients,
// holds it to g, and returns what it used on average.
func checkPattern(t *testing.T, pt rlqstest.Pattern, g patternGoal, name string, fl fleetOf) float64 {
	t.Helper()
	var used, least, most, lo, hi float64
	what := ""
	starts := patternStarts
	for k := range starts {
		_, window := pt.Window()
		start := time.Duration(k) * window / time.Duration(starts)
		r := runFleet(t, pt, start, fl)
		u, l, m, w := measurePattern(t, r, start)
		if name == "5s" {
			checkRecoveries(t, r, g.recovers, start)
		}
		n := float64(starts)
		used, least, most, what = used+u/n, least+l/n, most+m/n, w
		a, b := spread(r.Mine)
		lo, hi = lo+a/n, hi+b/n
	}
	t.Logf("%s: on average %.3f %s used, the least served %.2f of its share, the most %.2f; of the mean per Envoy, %.2f to %.2f",
		name, used, what, least, most, lo, hi)
	if g.evenly > 0 && (lo < g.evenly || hi > 2-g.evenly) {
		t.Errorf("%s: on average the Envoys were admitted %.2f to %.2f of the mean per Envoy, want within %.2f to %.2f", name, lo, hi, g.evenly, 2-g.evenly)
	}
	if used < g.ofLeft {
		t.Errorf("%s: on average %.3f %s used, want at least %.2f", name, used, what, g.ofLeft)
	}
	if least < g.fair {
		t.Errorf("%s: on average the Envoy served least got %.2f of its share %s, want at least %.2f", name, least, what, g.fair)
	}
	if g.short == "" && most > 2-g.fair {
		t.Errorf("%s: on average the Envoy served most got %.2f of its share %s, want at most %.2f", name, most, what, 2-g.fair)
	}
	return used
}

// spread is the least and the most of admissions, each over their mean.
func spread(admissions []int) (lo, hi float64) {
	sum := 0
	for _, n := range admissions {
		sum += n
	}
	if sum == 0 {
		return 0, 0
	}
	mean := float64(sum) / float64(len(admissions))
	lo = math.Inf(1)
	for _, n := range admissions {
		lo, hi = math.Min(lo, float64(n)/mean), math.Max(hi, float64(n)/mean)
	}
	return lo, hi
}

// measurePattern checks that no window of r admitted past the limit, and
// returns the share used of what is left (of the limit where nothing is
// left), the least and the most any Envoy got of its share of it, and
// which measure that is.
func measurePattern(t *testing.T, r *rlqstest.Result, start time.Duration) (used, least, most float64, what string) {
	t.Helper()
	limit, _ := r.Pattern.Window()
	if r.Worst() > int(limit) {
		t.Errorf("start %v: a window admitted %d, past the limit of %.0f", start, r.Worst(), limit)
	}
	used, perEnvoy, what := r.UsedOfLeft(), 1.0, "of what is left"
	if math.IsNaN(used) {
		used, perEnvoy, what = r.Used(), 0, "of the limit"
	}
	least, most = math.Inf(1), 0
	for i := range r.Pattern.Demands {
		if x := r.Ratio(i, perEnvoy); !math.IsNaN(x) {
			least, most = math.Min(least, x), math.Max(most, x)
		}
	}
	t.Logf("start %v: %.3f %s used, the least served %.2f of its share, the most %.2f; recoveries %v",
		start, used, what, least, most, r.Recoveries())
	return used, least, most, what
}

// checkRecoveries fails the run if a change in recovers was not back at
// 90% of what is left within two report intervals (10 s).
func checkRecoveries(t *testing.T, r *rlqstest.Result, recovers []time.Duration, start time.Duration) {
	t.Helper()
	for _, c := range r.Recoveries() {
		if slices.Contains(recovers, c.At) && (!c.Back || c.Took > 10*time.Second) {
			t.Errorf("start %v: the change at %v was not back at 90%% of what is left within 10 s (%+v)", start, c.At, c)
		}
	}
}

// The fake gRPC client reports as gRFC A77 describes: each bucket on a
// timer of its own, from when it was made, in a message of its own (the
// domain on the stream's first only), so the fleet tests' gRPC columns
// are a client unlike Envoy's.
func TestFakeGRPCClientReportsEachBucketAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := limiter.NewMemoryStore(limiter.MemoryOptions{})
		defer store.Close()
		conn, stop := serveInMemory(t, rlqs.Options{Store: store, Configs: load(t, patternConfig)})
		defer stop()
		e := rlqstest.Start(rlqstest.Options{Conn: conn, Domain: "fleet", Profile: rlqstest.GRPC, Report: 2 * time.Second, NoAssignment: rlqstest.Deny})
		defer e.Stop()
		e.Request(map[string]string{"tenant": "a"})
		time.Sleep(500 * time.Millisecond)
		e.Request(map[string]string{"tenant": "minute"})
		time.Sleep(4100 * time.Millisecond)
		synctest.Wait()
		sent := e.Sent()
		// Two initial reports, then each bucket's own at 2 s and 4 s.
		if len(sent) != 6 {
			t.Fatalf("%d reports sent, want 6 (two initial, two a bucket on its own timer)", len(sent))
		}
		for i, m := range sent {
			if n := len(m.GetBucketQuotaUsages()); n != 1 {
				t.Errorf("report %d holds %d buckets, want 1", i, n)
			}
			if (m.GetDomain() != "") != (i == 0) {
				t.Errorf("report %d has domain %q; want it on the first report only", i, m.GetDomain())
			}
		}
	})
}
