package rlqs

import (
	"math"
	"sort"
	"time"
)

// fill shares capacity (tokens per second) among demands by max-min
// fairness (water-filling): a demand below the level every unsatisfied
// member gets is met in full, the rest get the level; what the demands
// leave over is then spread evenly, so every member has room to show that
// it wants more. An infinite demand (a bucket not yet measured) takes the
// level. The shares never sum past capacity.
func fill(capacity float64, demands []float64) []float64 {
	out := make([]float64, len(demands))
	if capacity <= 0 || len(demands) == 0 {
		return out
	}
	order := make([]int, len(demands))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return demands[order[a]] < demands[order[b]] })
	left := capacity
	for k, i := range order {
		level := left / float64(len(order)-k)
		d := math.Max(demands[i], 0)
		if d >= level {
			for _, j := range order[k:] {
				out[j] = level
			}
			return out
		}
		out[i] = d
		left -= d
	}
	extra := left / float64(len(demands))
	for i := range out {
		out[i] += extra
	}
	return out
}

// setAside is what a member's grant needs in a window beside its rate:
// the tokens its bucket may hold when the window starts and, when its
// next token bucket starts full again (a first one, or one after DENY_ALL
// or a lapse), one more for that. Not set aside, a bucket whose grant
// must start full never fits once the others' shares fill the limit:
// it is cut to nothing, denied, and must start full again next round.
//
// A bucket whose capacity is to grow to what its demand calls for (see
// capacityFor) has that growth set aside too: the Envoy rescales the
// tokens it holds, which counts as a reset in the windows the new token
// bucket may arrive in. Not planned for, a growth never fitted a full
// pool, and the bucket kept a capacity of 1, which loses the refills that
// come due while its token waits (3 equal Envoys with Poisson arrivals:
// one held 7/1 beside 8/2 and 9/2, and admitted half its share).
func (m *member) setAside() float64 {
	start := startCapacity(m.b, int64(m.p.rule.Period/time.Second))
	switch {
	case m.b.sentKind != kindLimited || m.b.lapsed:
		return float64(max(m.l.burst, start)) + 1
	case m.b.sentCap < start && m.held() >= shrinkBelow:
		return 2 * float64(start) // the capacity it grows to, kept and reset
	}
	return float64(m.l.burst)
}

// fill sets every member's target: max-min fair shares of this replica's
// part of the limit (see exchangeDemand), of what it leaves once each
// bucket's window-start tokens (its capacity) are set aside (a reset's
// are not: the store refuses what no longer fits, and that bucket's next
// grant is smaller), among the buckets holders picks: when the limit
// cannot set aside every busy bucket's tokens, some get nothing in turn.
func (p *pool) fill() {
	var busy []*member
	for m := range p.members {
		m.target, m.holds = 0, false
		if m.want() > 0 {
			busy = append(busy, m)
		}
	}
	for m := range p.members {
		m.burst = m.nextBurst
	}
	per := p.rule.Period.Seconds()
	busy, kept := p.holders(busy)
	wants, held := make([]float64, len(busy)), make([]float64, len(busy))
	for i, m := range busy {
		wants[i], held[i] = m.wantPast(), m.held()
	}
	tokens := math.Floor(float64(p.rule.Limit)*p.frac - kept)
	shares := fill(tokens/per, wants)
	units := keepHeld(wholeTokens(shares, per, tokens, held), held, wants, per, tokens)
	for i, u := range units {
		busy[i].target, busy[i].holds = u/per, true
	}
	p.planBursts(busy, units, wants, per, tokens)
}

// planBursts sets each member's burst for the next fill: a capacity past
// what its grant calls for, paid from the room the pool has to spare once
// every busy member has all it wants. Arrivals that are not paced come in
// bursts, which a capacity of 1 or 2 meets empty-handed: 3 Envoys of 5 a
// second with Poisson arrivals, on 30 a second, admitted 83% of their
// requests with room for twice them. Each bucket costs its capacity in
// every window, so bursts take at most half the room to spare (what is
// left of it over the demands, bursts aside), the rest staying headroom for
// demand that moves, shared alike where they do not all fit (see
// burstTargets: grown in full one at a time, the last of 3 such Envoys
// never fitted, and admitted 0.75-0.83 of its requests where the others
// admitted 0.95); they shrink, alike, only when that room no longer pays
// for them, so that capacities do not flap with demand. A growth counts
// twice in the round it grows in (see setAside): one member grows a
// round, the one furthest below its target. Nothing changes while a
// member is not yet measured.
func (p *pool) planBursts(busy []*member, units, wants []float64, per, tokens float64) {
	room, extra := tokens, 0.0
	for m := range p.members {
		m.nextBurst = m.burst
		if m.want() == 0 {
			m.nextBurst = 0
		}
	}
	for i, m := range busy {
		if math.IsInf(wants[i], 1) {
			return
		}
		// Read against demand, not want: the want's tenth of headroom is
		// room too, and in a pool whose demand nearly fills its limit the
		// noise in the wants took the room from the bursts every few
		// rounds (4 Envoys of 1 a second with Poisson arrivals on 300 a
		// minute: every capacity fell back to 2, every 25 s or so).
		need := math.Ceil(math.Max(m.b.demand*per-extraPerPeriod, 0) - 1e-9)
		e := float64(m.l.burst) - float64(capacity(uint32(units[i])))
		room, extra = room-need+max(e, 0), extra+max(float64(m.nextBurst)-float64(capacity(uint32(units[i]))), 0)
	}
	if room < extra {
		shrinkBursts(p.members, busy, units, math.Max(room, 0)/extra)
		return
	}
	targets := burstTargets(busy, units, room/2)
	grow, gap := -1, uint64(0)
	for i, m := range busy {
		now := max(m.nextBurst, capacity(uint32(units[i])))
		if t := targets[i]; t > now && t-now > gap && float64(2*t-now) <= room-extra {
			grow, gap = i, t-now
		}
	}
	if grow >= 0 {
		busy[grow].nextBurst = targets[grow]
	}
}

// burstTargets is the capacity each busy member's bursts call for (see
// burstFor), past what its grant (units) calls for by no more, in all,
// than avail: each one's excess scaled alike where they do not all fit.
func burstTargets(busy []*member, units []float64, avail float64) []uint64 {
	targets := make([]uint64, len(busy))
	sum := 0.0
	for i, m := range busy {
		targets[i] = max(burstFor(m), capacity(uint32(units[i])))
		sum += float64(targets[i] - capacity(uint32(units[i])))
	}
	if sum > avail {
		for i := range targets {
			plain := capacity(uint32(units[i]))
			targets[i] = plain + uint64(math.Floor(float64(targets[i]-plain)*avail/sum))
		}
	}
	return targets
}

// shrinkBursts scales every busy member's burst past what its grant calls
// for by scale, so that the bursts fit the room again, rather than end
// them all at once (the capacities they leave flap with demand); the other
// members' end.
func shrinkBursts(members map[*member]struct{}, busy []*member, units []float64, scale float64) {
	kept := map[*member]bool{}
	for _, m := range busy {
		kept[m] = true
	}
	for m := range members {
		if !kept[m] {
			m.nextBurst = 0
		}
	}
	for i, m := range busy {
		if plain := capacity(uint32(units[i])); m.nextBurst > plain {
			m.nextBurst = plain + uint64(math.Floor(float64(m.nextBurst-plain)*scale))
		}
	}
}

// keepHeld keeps a grant in force (held, tokens per period) where the
// fill's new one (units) would change it for nothing: a member whose
// grant covers what it wants (wants, a rate) keeps it rather than be
// raised, and rather than be lowered while the grants kept still fit
// tokens (each member then gets at least its new grant, or all it wants).
// Every new token bucket costs the Envoy what it floors away of the
// tokens it holds: in a pool with room to spare, the room spread over the
// members moved with every report of any of them, and 4 Envoys of 1 a
// second (Poisson) on 300 a minute were sent a new grant nearly every
// round, and admitted two thirds of their requests.
func keepHeld(units, held, wants []float64, per, tokens float64) []float64 {
	covers := func(i int, q float64) bool { return q > 0 && q >= wants[i]*per-1e-9 }
	sum := 0.0
	for i := range units {
		if held[i] < units[i] && covers(i, held[i]) {
			units[i] = held[i]
		}
		sum += units[i]
	}
	for i := range units {
		if held[i] > units[i] && covers(i, units[i]) && sum+held[i]-units[i] <= tokens {
			sum += held[i] - units[i]
			units[i] = held[i]
		}
	}
	return units
}

// burstFor is the capacity a member's demand calls for, were its arrivals
// Poisson's: a count of λ a period spreads by √λ, so √λ + 1 (4 at 5 a
// period, 9 at 60), at most maxBurst.
func burstFor(m *member) uint64 {
	lambda := m.b.demand * m.p.rule.Period.Seconds()
	if math.IsInf(lambda, 1) || lambda <= 0 {
		return 0
	}
	return uint64(min(math.Ceil(math.Sqrt(lambda))+1, maxBurst))
}

// maxBurst bounds a burst: room to spare is better spent on a grant past
// that.
const maxBurst = 16

// wantPast is what a member wants beyond the 0.9 of a token per period
// every grant refills besides its target (see fillPeriods), in whole
// tokens per period, as a rate. Whole, rounded up: a bucket of capacity
// 1 refilled slower than paced requests come loses the refill that comes
// due while its token waits (nine light Envoys of 1/s, each refilled at
// 0.9 a second, admitted half their requests).
func (m *member) wantPast() float64 {
	w := m.want()
	if math.IsInf(w, 1) {
		return w
	}
	per := m.p.rule.Period.Seconds()
	return math.Max(math.Ceil((w*per-extraPerPeriod)-1e-9), 0) / per
}

// holders picks which of the busy members hold a share, and the tokens
// set aside for them (their window-start tokens, see setAside). Every
// busy member holds one while their set-asides fit the limit: a holder of
// no more than that still refills 0.9 of a token per period (see
// fillPeriods), so its window-start token is 90% used where demand keeps
// it busy. (When grants were whole tokens per period, a holder of one
// token spent half its cost on the window-start one: fewer held a share,
// at least 2 tokens per period each, and 30 Envoys of 2/s used 37% of a
// limit of 30/s.)
func (p *pool) holders(busy []*member) ([]*member, float64) {
	limit := float64(p.rule.Limit) * p.frac
	n, kept := len(busy), 0.0
	for _, m := range busy {
		kept += m.setAside()
	}
	sort.Slice(busy, func(i, j int) bool { return busy[i].want() > busy[j].want() })
	if kept > limit {
		// Crowded: not every member's tokens fit, so the shares rotate:
		// the members served least (sent fewest token buckets) hold them,
		// and a holder keeps its share until it has been served
		// rotateAfter rounds more than one waiting, not over noise in
		// demand (each change of holder costs a full start; 30 equal
		// Envoys changed places round after round and used a quarter of
		// the limit; held for good, two thirds of them got nothing).
		// Served counts token buckets sent, not shares planned: a share
		// the store could not hold yet serves nobody.
		sort.SliceStable(busy, func(i, j int) bool {
			if a, b := busy[i].turn(), busy[j].turn(); a != b {
				return a < b
			}
			return busy[i].want() > busy[j].want()
		})
	}
	for n > 0 && kept > limit {
		n--
		kept -= busy[n].setAside()
	}
	return busy[:n], kept
}

// rotateAfter is how many rounds a holder in a crowded pool keeps its
// share past a waiting member's service: two report intervals of Envoy
// 1.40 (5 s) at a round a second. Each change of holder costs a full
// start and a second of the old holder's room: 30 Envoys of 2/s on 30/s
// used 36% of the limit rotating after 10 rounds and 31% after 5 (60 s
// read).
const rotateAfter = 10

// turn orders a crowded pool's busy members for a share, least first: how
// often it was served, a member holding a token bucket rotateAfter less.
func (m *member) turn() int {
	if m.b.sentKind == kindLimited && !m.b.lapsed {
		return m.served - rotateAfter
	}
	return m.served
}

// wholeTokens turns shares (tokens per second) into whole tokens per
// period, so that a window's need is a whole number too: each share
// floored, then the tokens the floors left (of tokens in all) handed to
// the largest remainders, a member that holds more than its floor now
// (held, tokens per period) counted half a token ahead. Equal shares
// otherwise pass their odd token around as their measured demands move
// (3 Envoys with Poisson arrivals): each pass lowers one grant, whose
// tokens stay reserved until its horizon ends, and raises another,
// which then does not fit and is cut.
func wholeTokens(shares []float64, per, tokens float64, held []float64) []float64 {
	units := make([]float64, len(shares))
	left := tokens
	for i, t := range shares {
		units[i] = math.Floor(t*per + 1e-9)
		left -= units[i]
	}
	rank := make([]float64, len(shares))
	for i, t := range shares {
		rank[i] = t*per - units[i]
		if held[i] > units[i] {
			rank[i] += 0.5
		}
	}
	order := make([]int, len(shares))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return rank[order[a]] > rank[order[b]] })
	for _, i := range order {
		if left < 1 {
			break
		}
		if shares[i]*per-units[i] > 1e-9 {
			units[i]++
			left--
		}
	}
	return units
}
