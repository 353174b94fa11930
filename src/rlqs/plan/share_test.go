package plan

import (
	"math"
	"slices"
	"testing"
	"time"
)

func TestFill(t *testing.T) {
	inf := math.Inf(1)
	for _, tc := range []struct {
		name     string
		capacity float64
		demands  []float64
		want     []float64
	}{
		{"demands over capacity: small one met, rest even", 27, []float64{20, 20, 5}, []float64{11, 11, 5}},
		{"demands under capacity: leftover spread", 30, []float64{5, 5, 5}, []float64{10, 10, 10}},
		{"unmeasured takes the level", 30, []float64{inf, 4}, []float64{26, 4}},
		{"all unmeasured share evenly", 30, []float64{inf, inf, inf}, []float64{10, 10, 10}},
		{"no capacity", 0, []float64{3}, []float64{0}},
		{"negative demand counts as none", 10, []float64{-1, inf}, []float64{0, 10}},
		{"nobody", 10, nil, []float64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := waterFill(tc.capacity, tc.demands)
			if len(got) != len(tc.want) {
				t.Fatalf("waterFill = %v, want %v", got, tc.want)
			}
			sum := 0.0
			for i := range got {
				sum += got[i]
				if math.Abs(got[i]-tc.want[i]) > 1e-9 {
					t.Fatalf("waterFill = %v, want %v", got, tc.want)
				}
			}
			if sum > tc.capacity+1e-9 {
				t.Fatalf("shares %v sum to %v, past capacity %v", got, sum, tc.capacity)
			}
		})
	}
}

// TestWholeTokens: shares become whole tokens per period that sum to the
// tokens given; the odd tokens go to the largest remainders, and stay
// with a member that holds them unless another's remainder is half a
// token larger (equal Envoys passed the odd token around as their
// measured demand moved, each pass a lowered grant still reserved and a
// raised one that did not fit).
func TestWholeTokens(t *testing.T) {
	for _, tc := range []struct {
		name   string
		shares []float64 // tokens per second
		per    float64
		tokens float64
		held   []float64
		want   []float64
	}{
		{"largest remainder", []float64{8.30, 8.36, 8.34}, 1, 25, []float64{0, 0, 0}, []float64{8, 9, 8}},
		{"the odd token stays", []float64{8.30, 8.36, 8.34}, 1, 25, []float64{9, 8, 8}, []float64{9, 8, 8}},
		{"unless another is half a token ahead", []float64{8.1, 8.7, 8.2}, 1, 25, []float64{9, 8, 8}, []float64{8, 9, 8}},
		{"per minute", []float64{0.5, 0.5}, 60, 60, []float64{0, 0}, []float64{30, 30}},
		{"a share of nothing gets nothing", []float64{0, 2.5}, 1, 3, []float64{1, 0}, []float64{0, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := wholeTokens(tc.shares, tc.per, tc.tokens, tc.held)
			sum := 0.0
			for i := range got {
				sum += got[i]
				if got[i] != tc.want[i] {
					t.Fatalf("wholeTokens = %v, want %v", got, tc.want)
				}
			}
			if sum > tc.tokens {
				t.Fatalf("%v sums past %v tokens", got, tc.tokens)
			}
		})
	}
}

// keepHeld keeps a grant in force that covers what its member wants
// rather than raise or lower it for nothing, and lowers it where another
// member needs the room.
func TestKeepHeld(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		units, held, wants, wantQ []float64
		tokens                    float64
	}{
		{"a raise it does not need", []float64{8, 8}, []float64{6, 8}, []float64{5, 5}, []float64{6, 8}, 16},
		{"a fall for nothing: the room is there", []float64{6, 8}, []float64{8, 8}, []float64{5, 5}, []float64{8, 8}, 16},
		{"a fall another needs", []float64{6, 10}, []float64{8, 8}, []float64{5, 12}, []float64{6, 10}, 16},
		{"a grant short of its want is raised", []float64{6, 8}, []float64{4, 8}, []float64{5, 5}, []float64{6, 8}, 16},
		{"none held", []float64{8, 8}, []float64{0, 0}, []float64{5, 5}, []float64{8, 8}, 16},
		{"unmeasured", []float64{8, 8}, []float64{6, 6}, []float64{math.Inf(1), 5}, []float64{8, 6}, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := keepHeld(slices.Clone(tc.units), tc.held, tc.wants, 1, tc.tokens)
			if !slices.Equal(got, tc.wantQ) {
				t.Errorf("keepHeld(%v, held %v, wants %v) = %v, want %v", tc.units, tc.held, tc.wants, got, tc.wantQ)
			}
			sum := 0.0
			for _, u := range got {
				sum += u
			}
			if sum > tc.tokens {
				t.Errorf("grants sum to %v, past the %v tokens", sum, tc.tokens)
			}
		})
	}
}

// TestBurstsScaleAlike: where bursts do not all fit, each one's excess
// over the capacity its grant calls for is scaled alike, growing and
// shrinking, so none is left without one while another has all it
// wants.
func TestBurstsScaleAlike(t *testing.T) {
	units := []float64{20, 20} // a capacity of 2 each, plain
	for _, tc := range []struct {
		name    string
		demands []float64 // BurstFor: 9 at 64, 5 at 16
		avail   float64
		want    []uint64
	}{
		{"all fit", []float64{64, 16}, 10, []uint64{9, 5}},
		{"half fits", []float64{64, 16}, 5, []uint64{2 + 3, 2 + 1}},
		{"nothing fits", []float64{64, 16}, 0, []uint64{2, 2}},
	} {
		ms := []Member{{Demand: tc.demands[0]}, {Demand: tc.demands[1]}}
		got := burstTargets(ms, []int{0, 1}, units, tc.avail, 1)
		if got[0] != tc.want[0] || got[1] != tc.want[1] {
			t.Errorf("%s: targets %v, want %v", tc.name, got, tc.want)
		}
	}
	// Members 0 and 1 hold shares; 2 is busy but holds none (a crowded
	// pool rotates them).
	out := []Share{{NextBurst: 10}, {NextBurst: 6}, {NextBurst: 9}}
	shrinkBursts(out, []int{0, 1}, units, 0.5)
	if out[0].NextBurst != 2+4 || out[1].NextBurst != 2+2 {
		t.Errorf("bursts of 10 and 6 shrunk by half to %d and %d, want 6 and 4", out[0].NextBurst, out[1].NextBurst)
	}
	if out[2].NextBurst != 0 {
		t.Errorf("a member holding no share kept a burst of %d", out[2].NextBurst)
	}
}

// A member's want within chance of what it holds, or within a change's
// worth of it (churnTokens over churnSpan), is what it holds: a light
// per-minute bucket's noisy estimate does not move its grant every
// round, and a per-second grant still follows a whole token.
func TestSteadyWant(t *testing.T) {
	for _, tc := range []struct {
		name   string
		m      Member
		period time.Duration
		want   float64 // tokens per period
	}{
		{"per minute, within chance: held", Member{Demand: 0.55, Noise: 0.16, Held: 33}, time.Minute, 33},
		{"per minute, past chance: followed", Member{Demand: 1.5, Noise: 0.16, Held: 33}, time.Minute, 99},
		{"per minute, no noise, a token or two: held", Member{Demand: 0.52, Held: 33}, time.Minute, 33},
		{"per second, a whole token: followed", Member{Demand: 10, Held: 10}, time.Second, 11},
		{"nothing held: the want", Member{Demand: 0.55, Noise: 0.16}, time.Minute, 36},
		{"unmeasured: the want", Member{Demand: math.Inf(1), Held: 5}, time.Second, math.Inf(1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			per := tc.period.Seconds()
			if got := steadyWant(&tc.m, per) * per; math.Abs(got-tc.want) > 1e-9 && !(math.IsInf(got, 1) && math.IsInf(tc.want, 1)) {
				t.Errorf("steadyWant = %v tokens a period, want %v", got, tc.want)
			}
		})
	}
}

// On a limit lending reaches, a member's want has room for one standard
// deviation of its measure, for the spread its counts show: a Poisson
// light bucket's, none for a paced one, and none on a shorter limit,
// where what the room leaves unused would not come back.
func TestALightWantHasRoomForChance(t *testing.T) {
	for _, tc := range []struct {
		name   string
		m      Member
		period time.Duration
		want   float64 // a second
	}{
		{"per minute, Poisson", Member{Demand: 0.25, Noise: 0.1, Dispersion: 1}, time.Minute, 0.375},
		{"per minute, a quarter of Poisson's spread", Member{Demand: 0.25, Noise: 0.1, Dispersion: 0.25}, time.Minute, 0.325},
		{"per minute, paced", Member{Demand: 0.25, Noise: 0.1}, time.Minute, 0.275},
		{"per hour, Poisson", Member{Demand: 0.25, Noise: 0.1, Dispersion: 1}, time.Hour, 0.375},
		{"per second, Poisson: no room", Member{Demand: 0.25, Noise: 0.1, Dispersion: 1}, time.Second, 1},
		{"per 10 s, Poisson: no room", Member{Demand: 2, Noise: 0.3, Dispersion: 1}, 10 * time.Second, 2.2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := want(&tc.m, tc.period.Seconds()); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("want = %v a second, want %v", got, tc.want)
			}
		})
	}
}

// Fill never gives out more than the limit's part, set-asides counted,
// whatever the members, but for what the members granted more than their
// demand are expected to leave, on a limit lending reaches (overbook).
func TestFillStaysWithinTheLimit(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    Limit
		ms   []Member
	}{
		{"crowded", Limit{Tokens: 30, Period: time.Second, Frac: 1}, []Member{{Demand: 5}, {Demand: 5}, {Demand: 50, InForce: true, Held: 20, MaxCap: 2}}},
		{"unmeasured", Limit{Tokens: 300, Period: time.Minute, Frac: 0.5}, []Member{{Demand: math.Inf(1)}, {Demand: 1, Held: 70, InForce: true, MaxCap: 2}}},
		{"held past the limit", Limit{Tokens: 10, Period: time.Second, Frac: 1}, []Member{{Demand: 9, Held: 9, InForce: true, MaxCap: 1}, {Demand: 9, Held: 9, InForce: true, MaxCap: 1}}},
		{"overbooked", Limit{Tokens: 300, Period: time.Minute, Frac: 1}, []Member{{Demand: 4, Dispersion: 1}, {Demand: 4, Dispersion: 1},
			{Demand: 0.25, Dispersion: 1}, {Demand: 0.25, Dispersion: 1}, {Demand: 0.25, Dispersion: 1}, {Demand: 0.25, Dispersion: 1}}},
		{"overbooked, lights past the level with their room for chance", Limit{Tokens: 100, Period: time.Minute, Frac: 1}, []Member{{Demand: 4, Dispersion: 1},
			{Demand: 0.25, Noise: 0.2, Dispersion: 1}, {Demand: 0.25, Noise: 0.2, Dispersion: 1}, {Demand: 0.25, Noise: 0.2, Dispersion: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			per := tc.l.Period.Seconds()
			sum, left := 0.0, 0.0
			for i, sh := range Fill(tc.l, tc.ms) {
				if sh.Holds {
					sum += sh.Target*per + setAside(&tc.ms[i])
					if tc.ms[i].Demand < sh.Target {
						left += unused(&tc.ms[i], sh.Target*per, per)
					}
				}
			}
			if per < lendingPeriod {
				left = 0
			}
			if limit := float64(tc.l.Tokens) * tc.l.Frac; sum > limit+left+1e-9 {
				t.Errorf("shares and set-asides sum to %v, past the %v tokens of the limit's part and the %.1f its light members leave", sum, limit, left)
			}
		})
	}
}
