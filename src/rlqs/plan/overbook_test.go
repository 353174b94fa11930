package plan

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// simulate is Envoy's token bucket (refilled continuously at mu a second,
// capped at c, a request admitted while a whole token is held) under
// requests at lambda a second, Poisson's or paced, for secs seconds: the
// rate it admits.
func simulate(lambda, mu float64, c uint64, poisson bool, secs float64) float64 {
	rng := rand.New(rand.NewPCG(1, 2))
	tokens, admitted := float64(c), 0
	for t := 0.0; ; {
		dt := 1 / lambda
		if poisson {
			dt = rng.ExpFloat64() / lambda
		}
		if t += dt; t > secs {
			break
		}
		tokens = math.Min(float64(c), tokens+mu*dt)
		if tokens >= 1 {
			tokens--
			admitted++
		}
	}
	return float64(admitted) / secs
}

// admitted, the model overbook counts on, is held to the simulation for
// the buckets the fleet patterns hold: heavy and light, per second and
// per minute, refilled slower and faster than requests come, paced and
// Poisson.
func TestAdmittedFollowsTheSimulation(t *testing.T) {
	for _, tc := range []struct {
		name       string
		lambda, mu float64
		c          uint64
		poisson    bool
	}{
		{"heavy, Poisson, refilled a little slower", 20, 18.9, 2, true},
		{"heavy, Poisson, capacity 4", 20, 16.9, 4, true},
		{"light, Poisson, capacity 1", 2, 2.9, 1, true},
		{"light, Poisson, capacity 2", 2, 1.9, 2, true},
		{"a quarter a second, per minute's grant of 16", 0.25, 16.9 / 60, 2, true},
		{"a quarter a second, refilled at twice that", 0.25, 0.5, 2, true},
		{"one a second, Poisson, capacity 5", 1, 1.2, 5, true},
		{"paced, refilled faster", 5, 5.9, 2, false},
		{"paced, refilled slower", 20, 18.9, 2, false},
		{"paced, capacity 1", 2, 2.9, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			secs := 200_000 / tc.lambda
			want := simulate(tc.lambda, tc.mu, tc.c, tc.poisson, secs)
			dispersion := 0.0
			if tc.poisson {
				dispersion = 1
			}
			got := admitted(tc.lambda, dispersion, tc.mu, tc.c)
			if math.Abs(got-want) > 0.1*want {
				t.Errorf("admitted(%v, %v, %v, %v) = %.3f a second, the simulation admits %.3f", tc.lambda, dispersion, tc.mu, tc.c, got, want)
			}
			if got > math.Min(tc.lambda, tc.mu)+1e-9 {
				t.Errorf("admitted %.3f a second, past both the requests and the refills", got)
			}
		})
	}
}

// Overbooking grants the members that want more what the others are
// expected to leave: on a limit lending reaches only, for none while a
// member is unmeasured, more for light buckets whose requests spread than
// for paced ones, never past a member's want, and not for a change
// smaller than a change is worth.
func TestOverbookGrantsWhatLightBucketsLeave(t *testing.T) {
	light := func(d float64) Member { return Member{Demand: 0.25, Dispersion: d} }
	heavy := Member{Demand: 4, Dispersion: 1}
	// Two heavy of 4 a second and four light of 0.25: each light's share,
	// 16 a minute, covers its want; each heavy's, 100, falls short.
	pool := func(lights Member, per float64) ([]Member, []float64, []float64) {
		ms := []Member{heavy, heavy, lights, lights, lights, lights}
		units := []float64{100, 100, 16, 16, 16, 16}
		wants := []float64{4.4, 4.4, 16.0 / 60, 16.0 / 60, 16.0 / 60, 16.0 / 60}
		if per == 1 {
			units = []float64{2, 2, 1, 1, 1, 1}
			wants = []float64{4.4, 4.4, 1, 1, 1, 1}
		}
		return ms, units, wants
	}
	busy := []int{0, 1, 2, 3, 4, 5}
	run := func(ms []Member, units, wants []float64, per float64) []float64 {
		out := append([]float64(nil), units...)
		overbook(ms, busy, out, wants, per)
		return out
	}
	t.Run("Poisson lights leave more than paced ones", func(t *testing.T) {
		ms, units, wants := pool(light(1), 60)
		poisson := run(ms, units, wants, 60)
		ms, units, wants = pool(light(0), 60)
		paced := run(ms, units, wants, 60)
		if !(poisson[0] > paced[0] && paced[0] > units[0]) {
			t.Fatalf("heavy raised to %v with Poisson lights, %v with paced ones, from %v: want Poisson > paced > none", poisson[0], paced[0], units[0])
		}
		ms, _, _ = pool(light(1), 60)
		left := 0.0
		for k := 2; k < 6; k++ {
			if poisson[k] != units[k] {
				t.Errorf("a light bucket's grant moved from %v to %v", units[k], poisson[k])
			}
			left += unused(&ms[k], units[k], 60)
		}
		if raised := poisson[0] + poisson[1] - units[0] - units[1]; raised > left+1e-9 || raised < left-2 {
			t.Errorf("heavies raised by %v in all, want what the lights leave, %.1f, less at most a token each", raised, left)
		}
	})
	t.Run("never past the want", func(t *testing.T) {
		ms, units, wants := pool(light(1), 60)
		wants[0], wants[1] = 101.0/60, 101.0/60
		if got := run(ms, units, wants, 60); got[0] != 101 || got[1] != 101 {
			t.Errorf("heavies granted %v and %v, want their want, 101", got[0], got[1])
		}
	})
	t.Run("a light bucket capped at the level counts what it leaves", func(t *testing.T) {
		// Its want, with room for chance, is past its share: it is short,
		// and still leaves most of a grant twice its demand.
		ms, units, wants := pool(light(1), 60)
		units[2], wants[2] = 30, 40.0/60
		got := run(ms, units, wants, 60)
		left := 0.0
		for k := 2; k < 6; k++ {
			left += unused(&ms[k], units[k], 60)
		}
		if got[2] != 40 {
			t.Errorf("the capped light granted %v, want its want, 40", got[2])
		}
		if raised := got[0] + got[1] + got[2] - units[0] - units[1] - units[2]; raised > left+1e-9 || raised < left-3 {
			t.Errorf("raised by %v in all, want what the lights leave, %.1f (its own part too), less at most a token each", raised, left)
		}
	})
	t.Run("a member past its grant leaves nothing to book", func(t *testing.T) {
		ms, units, wants := pool(light(1), 60)
		for k := 2; k < 6; k++ {
			ms[k] = heavy // every member wants more than it holds
			wants[k] = 4.4
		}
		if got := run(ms, units, wants, 60); !slices.Equal(got, units) {
			t.Errorf("members all past their grants booked %v from %v, want nothing booked", got, units)
		}
	})
	t.Run("what a member with little room does not take goes to the rest", func(t *testing.T) {
		ms, units, wants := pool(light(1), 60)
		wants[1] = 102.0 / 60 // room for 2 tokens
		got := run(ms, units, wants, 60)
		left := 0.0
		for k := 2; k < 6; k++ {
			left += unused(&ms[k], units[k], 60)
		}
		if got[1] != 102 || got[0] < units[0]+left-2-1 {
			t.Errorf("heavies granted %v and %v from %v: want 102, and the rest of the %.1f left to the other", got[0], got[1], units[0], left)
		}
	})
	t.Run("not on a limit lending does not reach", func(t *testing.T) {
		ms, units, wants := pool(light(1), 1)
		if got := run(ms, units, wants, 1); got[0] != units[0] {
			t.Errorf("a per-second heavy raised from %v to %v", units[0], got[0])
		}
	})
	t.Run("not while a member is unmeasured", func(t *testing.T) {
		ms, units, wants := pool(light(1), 60)
		wants[5] = math.Inf(1)
		if got := run(ms, units, wants, 60); got[0] != units[0] {
			t.Errorf("heavy raised from %v to %v beside an unmeasured member", units[0], got[0])
		}
	})
	t.Run("a grant held within a change's worth is kept", func(t *testing.T) {
		ms, units, wants := pool(light(1), 60)
		booked := run(ms, units, wants, 60)
		ms[0].Held = booked[0] - 1
		if got := run(ms, units, wants, 60); got[0] != ms[0].Held {
			t.Errorf("heavy holding %v granted %v, want it kept", ms[0].Held, got[0])
		}
		ms[0].Held = booked[0] - 2*churnTokens*60/churnSpan.Seconds()
		if got := run(ms, units, wants, 60); got[0] != booked[0] {
			t.Errorf("heavy holding %v granted %v, want %v", ms[0].Held, got[0], booked[0])
		}
	})
}

// A bucket's spread is read from its reports: near 0 for paced requests,
// near 1 for Poisson's, at every interval, and 0 until enough are in.
func TestDispersionTellsPacedFromPoisson(t *testing.T) {
	for _, interval := range []time.Duration{time.Second, 5 * time.Second} {
		t.Run(interval.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 4))
			paced, poisson := NewDemand(), NewDemand()
			if poisson.Dispersion() != 0 {
				t.Fatalf("an unmeasured bucket's spread is %v, want 0", poisson.Dispersion())
			}
			var sumPaced, sumPoisson float64
			const rate, reports = 4.0, 600
			for i := range reports {
				n := rate * interval.Seconds()
				paced.Observe(uint64(n), interval)
				poisson.Observe(poissonCount(rng, n), interval)
				if i >= 60 {
					sumPaced, sumPoisson = sumPaced+paced.Dispersion(), sumPoisson+poisson.Dispersion()
				}
			}
			if got := sumPaced / (reports - 60); got > 0.05 {
				t.Errorf("paced requests read a spread of %.2f on average, want near 0", got)
			}
			if got := sumPoisson / (reports - 60); got < 0.6 || got > 1 {
				t.Errorf("Poisson requests read a spread of %.2f on average, want near 1 (at most 1)", got)
			}
		})
	}
}

// poissonCount is a count of Poisson requests with mean mean.
func poissonCount(rng *rand.Rand, mean float64) uint64 {
	n, t := uint64(0), rng.ExpFloat64()
	for t < mean {
		n++
		t += rng.ExpFloat64()
	}
	return n
}
