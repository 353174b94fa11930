package plan

import "math"

// planBursts sets each member's burst for the next fill: a capacity past
// what its grant calls for, paid from the room the pool has to spare once
// every busy member has all it wants. Arrivals that are not paced come in
// bursts, which a capacity of 1 or 2 meets empty-handed. Each bucket
// costs its capacity in every window, so bursts take at most half the
// room to spare (what is left of it over the demands, bursts aside), the
// rest staying headroom for demand that moves, shared alike where they do
// not all fit (see burstTargets); they shrink, alike, only when that room
// no longer pays for them, so that capacities do not flap with demand. A
// growth counts twice in the round it grows in (see setAside): one member
// grows a round, the one furthest below its target. Nothing changes while
// a member is not yet measured. Pinned by the rlqs package's burst tests
// and the Poisson fleet patterns.
func planBursts(ms []Member, out []Share, busy []int, units, wants []float64, per, tokens float64) {
	room, extra := tokens, 0.0
	for i := range ms {
		out[i].NextBurst = ms[i].Burst
		if want(&ms[i], per) == 0 {
			out[i].NextBurst = 0
		}
	}
	for k, i := range busy {
		if math.IsInf(wants[k], 1) {
			return
		}
		// Read against demand, not want: the want's tenth of headroom is
		// room too, and noise in the wants would otherwise take the room
		// from the bursts every few rounds.
		plain := float64(capacity(uint32(units[k])))
		need := math.Ceil(math.Max(ms[i].Demand*per-ExtraPerPeriod, 0) - 1e-9)
		room -= need - max(float64(ms[i].MaxCap)-plain, 0)
		extra += max(float64(out[i].NextBurst)-plain, 0)
	}
	if room < extra {
		shrinkBursts(out, busy, units, math.Max(room, 0)/extra)
		return
	}
	targets := burstTargets(ms, busy, units, room/2, per)
	grow, gap := -1, uint64(0)
	for k, i := range busy {
		now := max(out[i].NextBurst, capacity(uint32(units[k])))
		if t := targets[k]; t > now && t-now > gap && float64(2*t-now) <= room-extra {
			grow, gap = k, t-now
		}
	}
	if grow >= 0 {
		out[busy[grow]].NextBurst = targets[grow]
	}
}

// burstTargets is the capacity each busy member's bursts call for (see
// BurstFor), past what its grant (units) calls for by no more, in all,
// than avail: each one's excess scaled alike where they do not all fit.
func burstTargets(ms []Member, busy []int, units []float64, avail, per float64) []uint64 {
	targets := make([]uint64, len(busy))
	sum := 0.0
	for k, i := range busy {
		plain := capacity(uint32(units[k]))
		targets[k] = max(BurstFor(ms[i].Demand, per), plain)
		sum += float64(targets[k] - plain)
	}
	if sum > avail {
		for k := range targets {
			plain := capacity(uint32(units[k]))
			targets[k] = plain + uint64(math.Floor(float64(targets[k]-plain)*avail/sum))
		}
	}
	return targets
}

// shrinkBursts scales every busy member's burst past what its grant calls
// for by scale, so that the bursts fit the room again, rather than end
// them all at once (the capacities they leave flap with demand); the other
// members' end.
func shrinkBursts(out []Share, busy []int, units []float64, scale float64) {
	kept := make([]bool, len(out))
	for _, i := range busy {
		kept[i] = true
	}
	for i := range out {
		if !kept[i] {
			out[i].NextBurst = 0
		}
	}
	for k, i := range busy {
		if plain := capacity(uint32(units[k])); out[i].NextBurst > plain {
			out[i].NextBurst = plain + uint64(math.Floor(float64(out[i].NextBurst-plain)*scale))
		}
	}
}

// BurstFor is the capacity a demand (requests per second) calls for on a
// period of per seconds, were its arrivals Poisson's: a count of λ a
// period spreads by √λ, so √λ + 1, at most MaxBurst.
func BurstFor(demand, per float64) uint64 {
	lambda := demand * per
	if math.IsInf(lambda, 1) || lambda <= 0 {
		return 0
	}
	return uint64(min(math.Ceil(math.Sqrt(lambda))+1, MaxBurst))
}

// MaxBurst bounds a burst: room to spare is better spent on a grant past
// that.
const MaxBurst = 16
