package rlqstest

import (
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Pattern is a fleet's demand: one rate per fake Envoy (requests per
// second), paced or with Poisson arrivals, on a limit of 30 a second or,
// PerMinute, on one of 300 a minute. The same patterns run in virtual time
// against the service in-process (the rlqs package's fleet tests, which
// assert the goal per pattern) and in real time through the binary
// (BenchmarkRLQSPatterns, which measures it).
type Pattern struct {
	Name      string
	Demands   []float64
	Poisson   bool
	PerMinute bool
	// Moves, when set, gives the demand to one Envoy at a time, the next
	// every Moves (Envoy k of n from k×Moves, then (n+k)×Moves, ...).
	Moves time.Duration
	// Spans, when set, is when each Envoy has demand: from its first to
	// its second duration into the run (0: to the end).
	Spans [][2]time.Duration
	// Replicas is how many service processes share the store; Envoy i
	// talks to replica i×Replicas/n. 0 means 1.
	Replicas int
	// Bursts, when set, turns each Envoy's demand on and off every
	// Bursts, Envoy i of n a cycle's i/n later than Envoy 0.
	Bursts time.Duration
	// Lasts, when set, is how long a per-second pattern runs, in place of
	// its fleet's: long enough for shares that rotate to come round.
	Lasts time.Duration
}

// Patterns are the demand patterns of the RLQS goal (docs/rlqs.md).
func Patterns() []Pattern {
	return []Pattern{
		{Name: "3 equal (20/s each)", Demands: same(3, 20)},
		{Name: "3 equal, Poisson", Demands: same(3, 20), Poisson: true},
		{Name: "1 heavy (40/s) + 9 light (1/s)", Demands: append([]float64{40}, same(9, 1)...)},
		{Name: "1 heavy + 9 light, Poisson", Demands: append([]float64{40}, same(9, 1)...), Poisson: true},
		{Name: "30 Envoys (2/s each)", Demands: same(30, 2), Lasts: 90 * time.Second},
		{Name: "below the limit (3 x 5/s)", Demands: same(3, 5)},
		{Name: "below the limit, Poisson", Demands: same(3, 5), Poisson: true},
		{Name: "demand moving to another Envoy every 10 s (40/s)", Demands: same(3, 40), Moves: 10 * time.Second},
		{Name: "an Envoy leaving at 15 s, another joining at 20 s (20/s each)", Demands: same(3, 20),
			Spans: [][2]time.Duration{{0, 0}, {0, 15 * time.Second}, {20 * time.Second, 0}}},
		{Name: "an Envoy leaving at 15 s (3 x 20/s)", Demands: same(3, 20),
			Spans: [][2]time.Duration{{0, 0}, {0, 15 * time.Second}, {0, 0}}},
		{Name: "bursty: on 5 s, off 5 s, staggered (3 x 20/s)", Demands: same(3, 20), Bursts: 5 * time.Second},
		{Name: "per minute: 5 equal (2/s each)", Demands: same(5, 2), PerMinute: true},
		{Name: "per minute: 5 equal, Poisson", Demands: same(5, 2), PerMinute: true, Poisson: true},
		{Name: "per minute: 1 heavy (8/s) + 4 light (0.5/s)", Demands: append([]float64{8}, same(4, 0.5)...), PerMinute: true},
		{Name: "per minute: below the limit, Poisson (4 x 1/s)", Demands: same(4, 1), PerMinute: true, Poisson: true},
		{Name: "per minute: 2 x 4/s + 8 x 1/s, Poisson", Demands: append(same(2, 4), same(8, 1)...), PerMinute: true, Poisson: true},
		{Name: "per minute: 2 x 4/s + 8 x 0.25/s, Poisson", Demands: append(same(2, 4), same(8, 0.25)...), PerMinute: true, Poisson: true},
		{Name: "1 heavy (20/s) + 4 light (2/s), Poisson", Demands: append([]float64{20}, same(4, 2)...), Poisson: true},
		// Envoys 0 and 1 on the first replica, 2 on the second, which must
		// take a third of the limit, not half.
		{Name: "two replicas, 2 + 1 Envoys (20/s each)", Demands: same(3, 20), Replicas: 2},
	}
}

func same(n int, rate float64) []float64 {
	d := make([]float64, n)
	for i := range d {
		d[i] = rate
	}
	return d
}

// Window is the pattern's limit and the window it is counted in.
func (p Pattern) Window() (limit float64, window time.Duration) {
	if p.PerMinute {
		return 300, time.Minute
	}
	return 30, time.Second
}

// Fleet is where a pattern runs: a limit of 30 a second on bucket Second
// and one of 300 a minute on bucket Minute, in domain Domain, served on
// one connection per replica.
type Fleet struct {
	Conns          []grpc.ClientConnInterface
	Domain         string
	Second, Minute map[string]string
	// Run is how long a per-second pattern runs, read from Settle on;
	// Minutes how long a per-minute one runs, read from the first whole
	// minute after its first.
	Run, Settle, Minutes time.Duration
	// OnMessage, when set, hears of every report and response of Envoy i.
	OnMessage func(i int, m proto.Message, at time.Time)
	// Reports, when set, is the report interval of each Envoy in turn
	// (Envoy i reports every Reports[i mod len]); unset, every Envoy
	// reports every 5 s, as Envoy 1.40 does.
	Reports []time.Duration
	// Profiles, when set, is the client each Envoy plays in turn (see
	// Reports); unset, every one is Envoy 1.40's.
	Profiles []Profile
}

// profile is Envoy i's client (see Fleet.Profiles).
func (f Fleet) profile(i int) Profile {
	if len(f.Profiles) == 0 {
		return Envoy140
	}
	return f.Profiles[i%len(f.Profiles)]
}

// report is Envoy i's report interval (see Fleet.Reports).
func (f Fleet) report(i int) time.Duration {
	if len(f.Reports) == 0 {
		return 0
	}
	return f.Reports[i%len(f.Reports)]
}

// Result is what a fleet admitted under a pattern.
type Result struct {
	Pattern    Pattern
	Begin, End time.Time
	// First and Last are the windows read (window indices: Unix time over
	// the window), whole windows from the settle time to the end.
	First, Last int64
	// Per is every window's admissions; Asked its requests, admitted or
	// not; Each a window's admissions per Envoy; Mine each Envoy's
	// admissions in the windows read, and AskedMine its requests there.
	Per       map[int64]int
	Asked     map[int64]int
	Each      map[int64][]int
	Mine      []int
	AskedMine []int
}

// Run runs p on f with fake Envoys of Envoy 1.40 (DENY_ALL before a first
// assignment), from now, and returns what they admitted.
func (p Pattern) Run(f Fleet) *Result {
	_, window := p.Window()
	id := f.Second
	r := &Result{Pattern: p, Begin: time.Now(), Per: map[int64]int{}, Asked: map[int64]int{}, Each: map[int64][]int{},
		Mine: make([]int, len(p.Demands)), AskedMine: make([]int, len(p.Demands))}
	r.End = r.Begin.Add(f.Run)
	if p.Lasts > 0 {
		r.End = r.Begin.Add(p.Lasts)
	}
	settleAt := r.Begin.Add(f.Settle)
	if p.PerMinute {
		id, r.End = f.Minute, r.Begin.Add(f.Minutes)
		settleAt = r.Begin.Truncate(time.Minute).Add(2 * time.Minute)
	}
	r.First = (settleAt.UnixNano() + int64(window) - 1) / int64(window)
	r.Last = r.End.UnixNano()/int64(window) - 1
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, d := range p.Demands {
		var onMessage func(proto.Message, time.Time)
		if f.OnMessage != nil {
			onMessage = func(m proto.Message, at time.Time) { f.OnMessage(i, m, at) }
		}
		e := Start(Options{Conn: f.Conns[i*len(f.Conns)/len(p.Demands)], Domain: f.Domain, NoAssignment: Deny, OnMessage: onMessage, Report: f.report(i), Profile: f.profile(i),
			OnAdmit: func(_ string, at time.Time) {
				mu.Lock()
				defer mu.Unlock()
				r.admit(i, at.UnixNano()/int64(window))
			}})
		defer e.Stop()
		wg.Add(1)
		go func() {
			defer wg.Done()
			arrivals(d, p.Poisson, uint64(i), r.End, func() {
				if now := time.Now(); p.Active(i, r.Begin, now) {
					mu.Lock()
					w := now.UnixNano() / int64(window)
					r.Asked[w]++
					if w >= r.First && w <= r.Last {
						r.AskedMine[i]++
					}
					mu.Unlock()
					e.Request(id)
				}
			})
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	return r
}

func (r *Result) admit(i int, w int64) {
	r.Per[w]++
	if r.Each[w] == nil {
		r.Each[w] = make([]int, len(r.Pattern.Demands))
	}
	r.Each[w][i]++
	if w >= r.First && w <= r.Last {
		r.Mine[i]++
	}
}

// Worst is the most any window admitted.
func (r *Result) Worst() int {
	worst := 0
	for _, n := range r.Per {
		worst = max(worst, n)
	}
	return worst
}

// span is the seconds read; 0 when no whole window was.
func (r *Result) span() float64 {
	_, window := r.Pattern.Window()
	return float64(max(r.Last-r.First+1, 0)) * window.Seconds()
}

// Used is the share of the limit admitted in the windows read.
func (r *Result) Used() float64 {
	limit, window := r.Pattern.Window()
	used := 0
	for w := r.First; w <= r.Last; w++ {
		used += r.Per[w]
	}
	return float64(used) / r.span() / (limit / window.Seconds())
}

// UsedOfLeft is what the windows read admitted over what the goal is put
// on: in each window, the requests asked, or the limit less a token for
// each Envoy with demand when that is less (each holds its token bucket's
// window-start token). Asked, not the pattern's rates: Poisson arrivals
// ask more in some windows and less in others. NaN when nothing is left:
// more Envoys with demand than the limit has tokens.
func (r *Result) UsedOfLeft() float64 {
	used, left := 0, 0.0
	for w := r.First; w <= r.Last; w++ {
		used += r.Per[w]
		left += r.left(w)
	}
	if left <= 0 {
		return math.NaN()
	}
	return float64(used) / left
}

// left is what the goal is put on in window w: the requests asked in it,
// or the limit less a token for each Envoy with demand at its middle.
func (r *Result) left(w int64) float64 {
	p := r.Pattern
	limit, window := p.Window()
	mid := time.Unix(0, w*int64(window)+int64(window)/2)
	left := limit
	for i := range p.Demands {
		if p.Active(i, r.Begin, mid) {
			left--
		}
	}
	return math.Max(math.Min(float64(r.Asked[w]), left), 0)
}

// Demand is the fleet's demand a second, its Envoys' rates added up.
func (p Pattern) Demand() float64 {
	sum := 0.0
	for _, d := range p.Demands {
		sum += d
	}
	return sum
}

// Furthest is the Envoy whose admissions in the windows read are furthest
// from its max-min fair share, and their ratio; -1 when no Envoy has a
// share. The share is of the limit less perEnvoy tokens a window for each
// Envoy with demand: 0 for the whole limit, 1 for what the protocol
// leaves (each holds its token bucket's window-start token), which the
// goal is put on.
func (r *Result) Furthest(perEnvoy float64) (ratio float64, envoy int) {
	ratio, envoy = 1.0, -1
	for i := range r.Mine {
		if x := r.Ratio(i, perEnvoy); !math.IsNaN(x) && (math.Abs(x-1) > math.Abs(ratio-1) || envoy < 0) {
			ratio, envoy = x, i
		}
	}
	return ratio, envoy
}

// Ratio is Envoy i's admissions in the windows read over its max-min fair
// share (see Furthest for perEnvoy); NaN when it has no share. With
// Poisson arrivals, the shares are of the requests each Envoy asked in
// those windows, not of its rate, as UsedOfLeft's measure is: an Envoy
// of 1 a second asks 60 a minute give or take 8, and one that asked 47
// and was admitted all of them has had all it asked.
func (r *Result) Ratio(i int, perEnvoy float64) float64 {
	p := r.Pattern
	limit, window := p.Window()
	if p.Poisson && r.span() > 0 {
		p.Demands = make([]float64, len(r.AskedMine))
		for j, n := range r.AskedMine {
			p.Demands[j] = float64(n) / r.span()
		}
	}
	from, to := time.Unix(0, r.First*int64(window)), time.Unix(0, (r.Last+1)*int64(window))
	share := p.shares(limit/window.Seconds(), perEnvoy/window.Seconds(), r.Begin, from, to)[i]
	if share <= 0 {
		return math.NaN()
	}
	return float64(r.Mine[i]) / r.span() / share
}

// Active reports whether Envoy i has demand at t, in a run begun at begin.
func (p Pattern) Active(i int, begin, t time.Time) bool {
	in := t.Sub(begin)
	if p.Bursts > 0 {
		cycle := 2 * p.Bursts
		return (in+cycle*time.Duration(i)/time.Duration(len(p.Demands)))%cycle < p.Bursts
	}
	if p.Spans != nil && (in < p.Spans[i][0] || p.Spans[i][1] > 0 && in >= p.Spans[i][1]) {
		return false
	}
	return p.Moves == 0 || int(in/p.Moves)%len(p.Demands) == i
}

// shares is each Envoy's max-min fair share of capacity (a second) less
// perEnvoy for each Envoy with demand, averaged over [from, to): where
// demand moves or Envoys come and go, the shares of those with demand at
// each instant.
func (p Pattern) shares(capacity, perEnvoy float64, begin, from, to time.Time) []float64 {
	if p.Moves == 0 && p.Spans == nil && p.Bursts == 0 {
		return maxMinShares(math.Max(capacity-perEnvoy*float64(len(p.Demands)), 0), p.Demands)
	}
	out := make([]float64, len(p.Demands))
	step := 10 * time.Millisecond
	n := 0
	now := make([]float64, len(p.Demands))
	for t := from; t.Before(to); t = t.Add(step) {
		n++
		active := 0
		for i, d := range p.Demands {
			now[i] = 0
			if p.Active(i, begin, t) {
				now[i] = d
				active++
			}
		}
		for i, u := range maxMinShares(math.Max(capacity-perEnvoy*float64(active), 0), now) {
			out[i] += u
		}
	}
	for i := range out {
		out[i] /= float64(max(n, 1))
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
