package plan

import "math"

// Overbooking: granting the members a limit cannot meet what the others
// are expected to leave unused.
//
// A member granted more than its demand (a light bucket) holds a grant it
// does not use in full: the headroom its want carries (a tenth, and room
// for chance: see want), and, where its requests do not come paced, the
// refills its token bucket loses while it is full and the requests it
// denies while it is empty
// (docs/rlqs.md has what the fleet patterns lose to it). On a limit that
// lending reaches (lendingPeriod), the reports give what a window did not
// use back to the pool as the window goes on, but shares of the limit
// itself never let the members that want more take it: their shares were
// already all the limit leaves. So those members are granted, on top of
// their shares, what the others are expected to leave (overbook). The
// store, not the plan, keeps that exact: a grant the store cannot hold in
// full is cut to what it can, and each round tries it again as the lent
// tokens come back.

// lendingPeriod is the shortest period overbooked: a window that outlasts
// a report's reach, so that what a member leaves comes back within it
// (rlqs's lending). On a shorter one nothing comes back, and a grant
// booked past the limit is only cut again every round.
const lendingPeriod = 60

// overbook adds to the units (tokens a period) of the busy members whose
// shares do not cover their wants (wants, a rate) what the members granted
// more than their demand are expected to leave of their grants: shared
// max-min fair among the first, each raised no further than its want, and
// a grant held kept where the new one differs from it by less than a
// change is worth (see churnTokens). What a member leaves is counted
// wherever its demand is under its grant, a member short of its want too
// (a light bucket whose want, with its room for chance, is past the
// level), which may then take some of it back; a member whose demand is
// past its grant leaves next to nothing (its token bucket is mostly empty,
// and admitted's random walk, made for buckets near their rate, would read
// it leaving more). Pinned by TestOverbookGrantsWhatLightBucketsLeave and the
// per-minute fleet patterns.
func overbook(ms []Member, busy []int, units, wants []float64, per float64) {
	if per < lendingPeriod {
		return
	}
	left := 0.0
	var short []int
	var room []float64
	for k, i := range busy {
		if math.IsInf(wants[k], 1) {
			return // an even share for a bucket not yet measured: nothing is known
		}
		if ms[i].Demand*per < units[k] {
			left += unused(&ms[i], units[k], per)
		}
		if units[k] < wants[k]*per-1e-9 {
			short, room = append(short, k), append(room, math.Ceil(wants[k]*per-1e-9)-units[k])
		}
	}
	if len(short) == 0 {
		return
	}
	extra := waterFill(left, room)
	band := churnTokens * per / churnSpan.Seconds()
	for j, k := range short {
		booked := units[k] + math.Floor(math.Min(extra[j], room[j])+1e-9)
		if h := ms[busy[k]].Held; h >= units[k] && math.Abs(booked-h) < band {
			booked = h // what the others leave moves with noise in their spread
		}
		units[k] = booked
	}
}

// unused is what a member granted q tokens a period of per seconds is
// expected to leave of them in a period: its refills (q and the
// ExtraPerPeriod) less what its token bucket admits of its demand (see
// admitted), never less than nothing.
func unused(m *Member, q, per float64) float64 {
	if q <= 0 || m.Demand <= 0 {
		return math.Max(q, 0)
	}
	refill := q + ExtraPerPeriod
	c := max(capacity(uint32(min(q, math.MaxUint32))), m.Burst)
	return math.Max(math.Min(refill-admitted(m.Demand, m.Dispersion, refill/per, c)*per, q), 0)
}

// admitted is the rate (requests a second) that a token bucket refilled at
// mu a second with capacity c admits of requests arriving at lambda a
// second whose counts spread by dispersion (their variance over their
// mean: 1 Poisson, 0 paced). The tokens it holds are taken as a random
// walk between empty and full, drifting by mu - lambda with variance
// lambda×dispersion a second; what it admits is its refills less what
// overflows while it is full (the walk's loss at its upper bound). For a
// capacity of 1 it is exact with Poisson arrivals instead: each admission
// empties the bucket, which takes 1/mu to refill and then 1/lambda, on
// average, for the next request. Held to a simulation of Envoy's token
// bucket by TestAdmittedFollowsTheSimulation.
func admitted(lambda, dispersion, mu float64, c uint64) float64 {
	if lambda <= 0 || mu <= 0 || c == 0 || math.IsInf(lambda, 1) {
		return 0
	}
	dispersion = math.Min(math.Max(dispersion, 0), 1)
	paced := math.Min(lambda, mu)
	if c == 1 {
		return dispersion*lambda*mu/(lambda+mu) + (1-dispersion)*paced
	}
	drift, v, b := mu-lambda, lambda*dispersion, float64(c)
	var lost float64
	switch g := 2 * drift * b / math.Max(v, 1e-12); {
	case v <= 0:
		lost = math.Max(drift, 0)
	case math.Abs(g) < 1e-6:
		lost = v / (2 * b)
	case g > 0:
		lost = drift / -math.Expm1(-g)
	default:
		lost = drift * math.Exp(g) / math.Expm1(g)
	}
	return math.Max(math.Min(mu-lost, paced), 0)
}
