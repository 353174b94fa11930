package plan

import (
	"math"
	"sort"
	"time"
)

// Limit is one limit's pool as a fill sees it.
type Limit struct {
	Tokens uint64        // the limit: tokens per period
	Period time.Duration // whole seconds
	// Frac is this replica's part of the limit, by its part of the demand
	// all replicas published; 1 alone.
	Frac float64
}

// Member is one bucket's part of one limit as a fill sees it.
type Member struct {
	// Demand is the bucket's requests per second: +Inf until known, 0
	// idle; Noise what chance moves it by (Demand.Noise).
	Demand, Noise float64
	// Held is the grant in force for this limit, tokens per period: 0 when
	// the bucket holds no token bucket of this limit's period in force.
	Held float64
	// InForce is whether the bucket holds a token bucket that has not
	// lapsed (of whatever period): its next one does not start full.
	InForce bool
	// SentCap is the capacity last sent; MaxCap the largest that may be in
	// force now (the bucket may carry that many tokens into a window).
	SentCap, MaxCap uint64
	// StartCap is what StartCapacity gives the bucket's next token bucket.
	StartCap uint64
	// Served is how many rounds sent the bucket a token bucket.
	Served int
	// Burst is the capacity past its grant's that the pool pays for, in
	// force from this fill (the last fill's NextBurst).
	Burst uint64
	// Dispersion is how far its counts spread (Demand.Dispersion).
	Dispersion float64
}

// Share is what a fill gives a member.
type Share struct {
	Target float64 // tokens per second
	// Holds is whether the member holds a share: a token bucket of
	// Target, and the ExtraPerPeriod every grant carries, which a Target
	// of 0 still has.
	Holds bool
	// NextBurst is the burst in force from the next fill.
	NextBurst uint64
}

// Fill shares a limit among its members: max-min fair shares of this
// replica's part of it, of what it leaves once each holder's window-start
// tokens are set aside (see setAside), among the members holders picks
// (when the limit cannot set aside every busy member's tokens, they get a
// share in turn), in whole tokens per period; and each member's burst for
// the next fill (see planBursts). The shares and the tokens set aside
// never sum past the limit's part; on a limit lending reaches, the members
// that want more are then granted what the others are expected to leave
// (see overbook), which the store holds back until it is given back.
// Pinned by the rlqs package's pool tests and TestFleetPatterns.
func Fill(l Limit, ms []Member) []Share {
	out := make([]Share, len(ms))
	per := l.Period.Seconds()
	var busy []int
	for i := range ms {
		if want(&ms[i], per) > 0 {
			busy = append(busy, i)
		}
	}
	busy, kept := holders(l, ms, busy, per)
	wants, held := make([]float64, len(busy)), make([]float64, len(busy))
	for k, i := range busy {
		wants[k], held[k] = steadyWant(&ms[i], per), ms[i].Held
	}
	tokens := math.Floor(float64(l.Tokens)*l.Frac - kept)
	shares := waterFill(tokens/per, wants)
	units := keepHeld(wholeTokens(shares, per, tokens, held), held, wants, per, tokens)
	planBursts(ms, out, busy, units, wants, per, tokens)
	overbook(ms, busy, units, wants, per)
	for k, u := range units {
		out[busy[k]].Target, out[busy[k]].Holds = u/per, true
	}
	return out
}

// Want is the demand a fill sees, tokens per second (see want).
func Want(m Member, period time.Duration) float64 { return want(&m, period.Seconds()) }

// want is the demand a fill sees: what was measured, with room to grow by
// a tenth, so a bucket whose traffic rises shows it (as denials) and gets
// more on the next fill; and at least a token per period. On a limit
// lending reaches (lendingPeriod) it has room, too, for one standard
// deviation of what chance moves the measure by, for the spread its
// counts show (none when paced): a light bucket's demand is read from few
// requests, as often under its rate as over, and read under, its token
// bucket denies what comes. What that room leaves unused there comes back
// to the pool within the window (rlqs's lending) and goes to the members
// that want more (overbook); on a shorter limit nothing comes back, and
// the room would be lost. Unmeasured (+Inf), it takes an even share; idle
// (0), nothing, so that its window-start tokens go to the busy: a request
// it then denies shows in its next report. Pinned by
// TestALightWantHasRoomForChance and the per-minute fleet patterns.
func want(m *Member, per float64) float64 {
	if math.IsInf(m.Demand, 1) || m.Demand == 0 {
		return m.Demand
	}
	w := m.Demand * 1.1
	if per >= lendingPeriod {
		w += m.Noise * math.Sqrt(m.Dispersion)
	}
	return max(w, 1/per)
}

// wantPast is what a member wants beyond the ExtraPerPeriod every grant
// refills besides its target, in whole tokens per period (rounded up:
// a bucket of capacity 1 refilled slower than paced requests come loses
// the refill that comes due while its token waits), as a rate.
func wantPast(m *Member, per float64) float64 {
	w := want(m, per)
	if math.IsInf(w, 1) {
		return w
	}
	return math.Max(math.Ceil((w*per-ExtraPerPeriod)-1e-9), 0) / per
}

// steadyWant is wantPast, or the grant the member holds where the two
// differ by less than a change is worth: by less than chance moves the
// demand (Noise, with the want's tenth), or by less than churnTokens over
// churnSpan. A want read from noise moves every report, and every move of
// a grant costs the Envoy the part-token it was refilling; held still,
// a bucket's want that is truly higher shows as denials, which its
// reports count, and moves past the band.
func steadyWant(m *Member, per float64) float64 {
	w := wantPast(m, per)
	if m.Held <= 0 || math.IsInf(w, 1) {
		return w
	}
	band := math.Max(1.1*m.Noise*per, churnTokens*per/churnSpan.Seconds())
	if math.Abs(w*per-m.Held) <= band {
		return m.Held / per
	}
	return w
}

// SetAside is what a member's grant needs in a window beside its rate
// (see setAside).
func SetAside(m Member) float64 { return setAside(&m) }

// setAside is what a member's grant needs in a window beside its rate:
// the tokens its bucket may hold when the window starts and, when its
// next token bucket starts full again (a first one, or one after DENY_ALL
// or a lapse), one more for that; not set aside, a grant that must start
// full never fits once the others' shares fill the limit. A capacity
// about to grow to what its demand calls for has that growth set aside
// too: the Envoy rescales the tokens it holds, which counts as a reset in
// the windows the new token bucket may arrive in.
func setAside(m *Member) float64 {
	switch {
	case !m.InForce:
		return float64(max(m.MaxCap, m.StartCap)) + 1
	case m.SentCap < m.StartCap && m.Held >= ShrinkBelow:
		return 2 * float64(m.StartCap) // the capacity it grows to, kept and reset
	}
	return float64(m.MaxCap)
}

// RotateAfter is how many rounds a holder in a crowded pool keeps its
// share past a waiting member's service (see holders): each change of
// holder costs a full start, so holders change no oftener than that;
// rotating sooner used less of the limit, and holding for good starved
// most. Pinned by TestPoolFillRotates and the 30-Envoy fleet pattern.
const RotateAfter = 10

// turn orders a crowded pool's busy members for a share, least first: how
// often it was served, a member holding a token bucket RotateAfter less.
func turn(m *Member) int {
	if m.InForce {
		return m.Served - RotateAfter
	}
	return m.Served
}

// holders picks which of the busy members hold a share, and the tokens
// set aside for them. Every busy member holds one while their set-asides
// fit the limit: a holder of no more than that still refills
// ExtraPerPeriod, so its window-start token is mostly used where demand
// keeps it busy. Crowded, not every member's tokens fit, so the shares
// rotate: the members served least hold them, and a holder keeps its
// share until it has been served RotateAfter rounds more than one waiting,
// not over noise in demand. Served counts token buckets sent, not shares
// planned: a share the store could not hold yet serves nobody.
func holders(l Limit, ms []Member, busy []int, per float64) ([]int, float64) {
	limit := float64(l.Tokens) * l.Frac
	n, kept := len(busy), 0.0
	for _, i := range busy {
		kept += setAside(&ms[i])
	}
	wants := func(a, b int) bool { return want(&ms[busy[a]], per) > want(&ms[busy[b]], per) }
	sort.Slice(busy, wants)
	if kept > limit {
		sort.SliceStable(busy, func(a, b int) bool {
			if x, y := turn(&ms[busy[a]]), turn(&ms[busy[b]]); x != y {
				return x < y
			}
			return wants(a, b)
		})
	}
	for n > 0 && kept > limit {
		n--
		kept -= setAside(&ms[busy[n]])
	}
	return busy[:n], kept
}

// waterFill shares capacity (tokens per second) among demands by max-min
// fairness: a demand below the level every unsatisfied member gets is met
// in full, the rest get the level; what the demands leave over is then
// spread evenly, so every member has room to show that it wants more. An
// infinite demand (a bucket not yet measured) takes the level. The shares
// never sum past capacity.
func waterFill(capacity float64, demands []float64) []float64 {
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

// wholeTokens turns shares (tokens per second) into whole tokens per
// period, so that a window's need is a whole number too: each share
// floored, then the tokens the floors left (of tokens in all) handed to
// the largest remainders, a member that holds more than its floor now
// (held, tokens per period) counted half a token ahead, so that equal
// shares do not pass their odd token around as their demands move (each
// pass lowers one grant, whose tokens stay reserved to its horizon, and
// raises another, which then does not fit).
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

// keepHeld keeps a grant in force (held, tokens per period) where the
// fill's new one (units) would change it for nothing, or for less than it
// costs: a member whose grant covers what it wants (wants, a rate), or
// whose new grant differs from it by less than a change is worth (see
// churnTokens), keeps it rather than be raised, and rather than be lowered
// while the grants kept still fit tokens (each member then gets at least
// its new grant, or all it wants). Every new token bucket costs the Envoy
// what it floors away of the tokens it holds, so grants that follow every
// move of demand or of the room to spare lose more than they give.
// Pinned by TestKeepHeld and the per-minute fleet patterns at every
// reporting interval (TestFleetPatterns).
func keepHeld(units, held, wants []float64, per, tokens float64) []float64 {
	covers := func(i int, q float64) bool { return q > 0 && q >= wants[i]*per-1e-9 }
	small := func(i int) bool {
		return held[i] > 0 && math.Abs(units[i]-held[i])*churnSpan.Seconds()/per < churnTokens
	}
	sum := 0.0
	for i := range units {
		if held[i] < units[i] && (covers(i, held[i]) || small(i)) {
			units[i] = held[i]
		}
		sum += units[i]
	}
	for i := range units {
		if held[i] > units[i] && (covers(i, units[i]) || small(i)) && sum+held[i]-units[i] <= tokens {
			sum += held[i] - units[i]
			units[i] = held[i]
		}
	}
	return units
}

// A change of grant is worth sending when what it changes over churnSpan
// comes to churnTokens or more: a change costs the Envoy up to a token
// (the fraction it floors away as it takes the new token bucket), and a
// grant is expected to last about as long as demand is read over
// (steadySpan). So a per-second grant follows every whole token of its
// share, and a per-minute one moves by 3 tokens a minute or more: reports
// every second moved a light bucket's per-minute share by a token or two
// every round, and each move floored away the part-token it was
// refilling, so it never held a whole one.
const (
	churnSpan   = steadySpan
	churnTokens = 1.0
)
