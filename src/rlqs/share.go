package rlqs

import (
	"math"
	"time"

	"github.com/openrls/ratelimit/src/rlqs/plan"
)

// A pool's fill, as the planner makes it: what the service knows of each
// member is copied into plan's values, and the shares that come back are
// the members' targets and bursts.

// fill sets every member's target, share and next burst (plan.Fill).
func (p *pool) fill() {
	ms := make([]*member, 0, len(p.members))
	for m := range p.members {
		m.burst = m.nextBurst
		ms = append(ms, m)
	}
	views := make([]plan.Member, len(ms))
	for i, m := range ms {
		views[i] = m.view()
	}
	shares := plan.Fill(plan.Limit{Tokens: p.rule.Limit, Period: p.rule.Period, Frac: p.frac}, views)
	for i, sh := range shares {
		ms[i].target, ms[i].holds, ms[i].nextBurst = sh.Target, sh.Holds, sh.NextBurst
	}
}

// view is what the planner sees of m.
func (m *member) view() plan.Member {
	b := m.b
	return plan.Member{Demand: b.demand, Noise: b.est.Noise(), Dispersion: b.est.Dispersion(), Held: m.held(), InForce: b.sentKind == kindLimited && !b.lapsed,
		SentCap: b.sentCap, MaxCap: m.l.burst, StartCap: startCapacity(b, m.p.period()), Served: m.served, Burst: m.burst}
}

// held is the grant in force for the member's limit, in tokens per
// period: what its bucket was last sent, when that is a token bucket of
// this limit's period still in force; else 0.
func (m *member) held() float64 {
	b := m.b
	if b.sentKind != kindLimited || b.lapsed || time.Duration(b.sentF)*time.Second != m.p.rule.Period {
		return 0
	}
	return float64(b.sentQ)
}

// want is the demand the member's pool sees (plan.Want).
func (m *member) want() float64 { return plan.Want(plan.Member{Demand: m.b.demand}, m.p.rule.Period) }

// setAside is what the member's grant needs in a window beside its rate
// (plan.SetAside).
func (m *member) setAside() float64 { return plan.SetAside(m.view()) }

// period is the pool's period in whole seconds.
func (p *pool) period() int64 { return int64(p.rule.Period / time.Second) }

// startCapacity is the capacity b's demand calls for on a period of f
// seconds (plan.StartCapacity), its pools' bursts counted.
func startCapacity(b *bucket, f int64) uint64 {
	return plan.StartCapacity(b.demand, f, burstRoom(b))
}

// burstRoom is the capacity every pool of b pays for beyond what its
// grant calls for: the least of its members' bursts.
func burstRoom(b *bucket) uint64 {
	if len(b.members) == 0 {
		return 0
	}
	room := uint64(math.MaxUint64)
	for _, m := range b.members {
		room = min(room, m.burst)
	}
	return room
}
