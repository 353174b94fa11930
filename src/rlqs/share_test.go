package rlqs

import (
	"math"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"

	"github.com/openrls/ratelimit/src/rlqs/plan"
)

// TestPoolFillSkewed: one bucket of 40/s beside nine of 1/s on a limit of
// 30 a second. Each bucket's window-start token is set aside (10), and of
// the 20 tokens left the light ones get what they use past the 0.9 a
// second every grant refills besides (their demand and a tenth), in whole
// tokens, rounded up: 1 each, since a token bucket of 0.9 a second and
// capacity 1 admits every other request of 1 a second. The heavy one gets
// the rest, 11 a second. A bucket whose next grant starts full (here the
// heavy one, after a DENY_ALL) has its start's tokens set aside for that,
// so that it fits.
func TestPoolFillSkewed(t *testing.T) {
	for _, heavyReset := range []bool{false, true} {
		p := &pool{rule: limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 30, Period: time.Second}, members: map[*member]struct{}{}, frac: 1}
		add := func(demand float64, reset bool) *member {
			b := &bucket{demand: demand, sentKind: kindLimited}
			if reset {
				b.sentKind = kindDeny
			}
			m := &member{b: b, p: p, l: newLedger(time.Second)}
			b.members = []*member{m}
			p.members[m] = struct{}{}
			return m
		}
		heavy := add(40, heavyReset)
		var light []*member
		for range 9 {
			light = append(light, add(1, false))
		}
		p.fill()
		total := heavy.target
		for _, m := range light {
			if m.target < 1 {
				t.Errorf("reset %v: a light bucket's target %.2f, want at least 1", heavyReset, m.target)
			}
			total += m.target
		}
		want := 11.0
		if heavyReset {
			want = 9 // its start set aside: a capacity of 2, full
		}
		if heavy.target < want {
			t.Errorf("reset %v: the heavy bucket's target %.2f, want at least %.0f", heavyReset, heavy.target, want)
		}
		if kept := 10.0 + map[bool]float64{true: 1}[heavyReset]; total > 30-kept+1e-9 {
			t.Errorf("reset %v: targets sum to %.2f, past the %.0f left beside the set-aside tokens", heavyReset, total, 30-kept)
		}
	}
}

// TestPoolFillCrowded: 30 buckets of 2/s on a limit of 30 a second, 10
// holding a token bucket (each sets aside its window-start token) and 20
// denied last round (each sets aside a start besides). Every grant refills
// 0.9 of a token per period beyond its target, so a share of its
// window-start token alone is worth holding: as many hold a share as
// their set-asides fit in the limit, the ones holding a token bucket
// first, and what they set aside never passes it.
func TestPoolFillCrowded(t *testing.T) {
	p := &pool{rule: limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 30, Period: time.Second}, members: map[*member]struct{}{}, frac: 1}
	var holders []*member
	for i := range 30 {
		b := &bucket{demand: 2, sentKind: kindLimited}
		if i >= 10 {
			b.sentKind = kindDeny // denied last round: not holding a token bucket
		}
		m := &member{b: b, p: p, l: newLedger(time.Second)}
		b.members = []*member{m}
		p.members[m] = struct{}{}
		if i < 10 {
			holders = append(holders, m)
		}
	}
	p.fill()
	held, cost := 0, 0.0
	for m := range p.members {
		if m.holds {
			held++
			cost += m.target*p.rule.Period.Seconds() + m.setAside()
		}
	}
	// 10 × 1 for the holders, 2 for each other that holds: 10 others fit.
	if held != 20 {
		t.Errorf("%d buckets hold a share, want 20 (every one whose set-aside fits)", held)
	}
	if cost > 30+1e-9 {
		t.Errorf("shares and set-asides of %.2f, past the limit of 30", cost)
	}
	for _, h := range holders {
		if !h.holds {
			t.Fatal("a bucket holding a token bucket lost its share to a denied one of the same demand")
		}
	}
}

// TestPoolFillGivesTheUnmeasuredAll: a member not yet measured takes the
// level, the whole pool when it is alone: no share is kept back for
// Envoys that may come. One kept back (an even share for one more) cost
// an Envoy that demand moved to a third of the limit for its first 5 s,
// while the pool's first reporter, now lowered when others come, hands
// its room over within two rounds (see handOvers).
func TestPoolFillGivesTheUnmeasuredAll(t *testing.T) {
	for _, tc := range []struct {
		name    string
		demands []float64
		most    float64 // the targets' sum, at most (each start's tokens set aside: see setAside)
		least   float64 // and at least
	}{
		{"the first reporter", []float64{math.Inf(1)}, 27, 27},
		{"two unmeasured", []float64{math.Inf(1), math.Inf(1)}, 24, 24},
		{"measured beside unmeasured", []float64{5, math.Inf(1)}, 25, 25},
		{"all measured", []float64{20, 20}, 24, 24},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &pool{rule: limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 30, Period: time.Second}, members: map[*member]struct{}{}, frac: 1}
			for _, d := range tc.demands {
				b := &bucket{demand: d}
				m := &member{b: b, p: p, l: newLedger(time.Second)}
				b.members = []*member{m}
				p.members[m] = struct{}{}
			}
			p.fill()
			sum := 0.0
			for m := range p.members {
				sum += m.target
			}
			if sum > tc.most+1e-9 || sum < tc.least-1e-9 {
				t.Errorf("targets sum to %.2f, want %.0f to %.0f", sum, tc.least, tc.most)
			}
		})
	}
}

// TestPoolFillPlansAGrowth: three buckets of 20/s on a limit of 30 a
// second, two holding 8 a second with a capacity of 2, one 7 with a
// capacity of 1 (it started on a small share). Its capacity is to grow to
// 2, which counts as a reset in two windows: the fill sets that aside
// (twice the new capacity), and the grant on the round's first try grows.
// Unplanned, the growth never fitted, and the bucket kept 7/1 for good.
func TestPoolFillPlansAGrowth(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	p := &pool{key: "k", rule: limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 30, Period: time.Second}, members: map[*member]struct{}{}, frac: 1}
	add := func(q uint32, c uint64) *member {
		b := &bucket{demand: 20, sentKind: kindLimited, sentQ: q, sentF: 1, sentCap: c, sent: now}
		l := newLedger(time.Second)
		l.burst, l.sent = c, c
		m := &member{b: b, p: p, l: l}
		b.members = []*member{m}
		p.members[m] = struct{}{}
		return m
	}
	add(8, 2)
	add(8, 2)
	grower := add(7, 1)
	if got := grower.setAside(); got != 4 {
		t.Errorf("the growing bucket has %v set aside, want 4", got)
	}
	p.fill()
	sum := 0.0
	for m := range p.members {
		sum += m.target
	}
	if sum > 30-8+1e-9 {
		t.Errorf("targets sum to %.2f, past the 22 left beside 8 set aside", sum)
	}
	if grower.target*1 < plan.ShrinkBelow {
		t.Fatalf("the growing bucket's target %.2f, below %d", grower.target, plan.ShrinkBelow)
	}
	s := bare(Options{})
	if j := s.sizedJob(grower.b, now, uint32(grower.target), 1, true); j.capacity != 2 {
		t.Errorf("the first try's capacity %d, want 2", j.capacity)
	}
}

// TestPoolFillRotates: in a crowded pool (30 buckets of 2/s on 30/s: a
// bucket holding a token bucket sets aside a token a window, one that
// starts anew two) the shares rotate: a holder keeps its share for
// about plan.RotateAfter fills, then one that waited takes it, and over many
// fills every bucket is served about as often as any other. Held for
// good, 20 of the 30 got nothing.
func TestPoolFillRotates(t *testing.T) {
	p := &pool{rule: limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 30, Period: time.Second}, members: map[*member]struct{}{}, frac: 1}
	var all []*member
	for range 30 {
		b := &bucket{demand: 2, sentKind: kindDeny}
		m := &member{b: b, p: p, l: newLedger(time.Second)}
		b.members = []*member{m}
		p.members[m] = struct{}{}
		all = append(all, m)
	}
	changes := 0
	const fills = 300
	for range fills {
		p.fill()
		for _, m := range all {
			// What the round sends: a token bucket to a holder, DENY_ALL to
			// the rest.
			kind := kindDeny
			if m.holds {
				kind = kindLimited
				m.served++ // as settle counts a token bucket sent
			}
			if kind != m.b.sentKind {
				changes++
			}
			m.b.sentKind = kind
		}
	}
	least, most := fills, 0
	for _, m := range all {
		least, most = min(least, m.served), max(most, m.served)
	}
	if least == 0 || most-least > 2*plan.RotateAfter {
		t.Errorf("served %d to %d fills of %d, want every bucket a turn and within %d of each other", least, most, fills, 2*plan.RotateAfter)
	}
	// Each change of holder is two changes (one out, one in); a holder
	// that kept its share for plan.RotateAfter fills changes about 2×30×fills /
	// (3×plan.RotateAfter) times in all.
	if limit := 2 * len(all) * fills / plan.RotateAfter; changes > limit {
		t.Errorf("%d changes of holder in %d fills, want at most %d: shares must not flap", changes, fills, limit)
	}
}

// TestAPassedOverHolderIsDeniedAtOnce: a bucket holding a token bucket
// whose share went to another (it still wants more), or that reported no
// requests, is sent DENY_ALL at once, which hands its room over a delivery
// bound later. Run on, the passed-over one's room stayed reserved to its
// horizon and a rotating pool used 37% of its limit with two Envoys of 30
// never served; an idle one kept the room of an Envoy its demand had
// moved to for 3 s past its report. One whose token bucket may have lapsed
// is denied only when the last DENY_ALL is old (holdBack).
func TestAPassedOverHolderIsDeniedAtOnce(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name   string
		demand float64
		sent   kind
		lapsed bool
		want   *kind // nil: nothing sent
	}{
		{"passed over", 2, kindLimited, false, ptr(kindDeny)},
		{"idle", 0, kindLimited, false, ptr(kindDeny)},
		{"idle, lapsed", 0, kindLimited, true, ptr(kindDeny)},
		{"idle, denied a moment ago", 0, kindDeny, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := bare(Options{})
			p := &pool{key: "k", rule: limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 30, Period: time.Second}, members: map[*member]struct{}{}, frac: 1}
			b := &bucket{kind: kindLimited, sentKind: tc.sent, sentQ: 2, sentF: 1, sentCap: 1, sent: now, demand: tc.demand, lapsed: tc.lapsed}
			m := &member{b: b, p: p, l: newLedger(time.Second)}
			b.members = []*member{m}
			j := s.jobFor(b, now)
			switch {
			case tc.want == nil && j != nil:
				t.Errorf("sent %v, want nothing", j.kind)
			case tc.want != nil && (j == nil || j.kind != *tc.want):
				t.Errorf("sent %v, want %v", j, *tc.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestPoolFillPlansBursts: 3 buckets of 5/s (Poisson's bursts) on a limit
// of 30 a second, each with a capacity of 2, leave room to spare: the fill
// grows one bucket's capacity a round, each alike, as far as half the
// room pays for (burstFor's 4 for all would take more: 3 each), and a
// bucket whose want outgrows the room shrinks every burst. (Grown in full
// one at a time, the third never fitted, and it admitted 0.75-0.83 of
// its requests where the others admitted 0.95.)
func TestPoolFillPlansBursts(t *testing.T) {
	p, ms := burstPool(30, time.Second, 3, 5, 8)
	bursts := func() (n int) {
		for _, m := range ms {
			if m.nextBurst > plan.PlainCapacity {
				n++
				if m.nextBurst > plan.BurstFor(m.b.demand, m.p.rule.Period.Seconds()) {
					t.Errorf("a burst of %d, past burstFor's %d", m.nextBurst, plan.BurstFor(m.b.demand, m.p.rule.Period.Seconds()))
				}
			}
		}
		return n
	}
	for round := 1; round <= 4; round++ {
		p.fill()
		if n := bursts(); n > round {
			t.Fatalf("round %d: %d bursts, more than one a round", round, n)
		}
		// The grown bucket's token bucket now holds its burst.
		for _, m := range ms {
			if m.nextBurst > plan.PlainCapacity {
				m.l.burst, m.b.sentCap = m.nextBurst, m.nextBurst
			}
		}
	}
	sum := 0.0
	for _, m := range ms {
		if m.l.burst != 3 {
			t.Errorf("a capacity of %d after four rounds, want 3 for each", m.l.burst)
		}
		sum += float64(m.l.burst)
	}
	if sum > 30-15 {
		t.Errorf("capacities sum to %v, more than the room to spare", sum)
	}
	ms[0].b.demand = 40 // now short of its want
	p.fill()
	if n := bursts(); n != 0 {
		t.Errorf("%d bursts left once a member is short", n)
	}
	p.fill() // the ended bursts are in force from this fill
	for _, m := range ms {
		if c := plan.CapacityFor(m.b.sentCap, 8, startCapacity(m.b, 1), false, true); m.b.sentCap > plan.PlainCapacity && c > plan.PlainCapacity {
			t.Errorf("a burst no longer paid for keeps capacity %d", c)
		}
	}
}

// TestBurstsSpendTheHeadroom: 4 buckets of 1.1 a second on 300 a minute
// want 72 tokens a minute each with their tenth of headroom, which leaves
// the pool 4 to spare; read against their demand (66), it has 28, and half
// of that pays for bursts, scaled alike: 5 each, where their arrivals'
// √66 + 1 asks 10. Read against the wants, noise in them took the room
// from the bursts every few rounds.
func TestBurstsSpendTheHeadroom(t *testing.T) {
	p, ms := burstPool(300, time.Minute, 4, 1.1, 72)
	for range 5 {
		p.fill()
		for _, m := range ms {
			if m.nextBurst > plan.PlainCapacity {
				m.l.burst, m.b.sentCap = m.nextBurst, m.nextBurst
			}
		}
	}
	for _, m := range ms {
		if m.l.burst != 5 {
			t.Errorf("a capacity of %d after five rounds, want 5 for each", m.l.burst)
		}
		if got := m.target * 60; got < 66 {
			t.Errorf("a share of %.1f a minute, under the demand of 66", got)
		}
	}
}

// burstPool is a pool of limit a period with n members of demand (a
// second), each holding a grant of q tokens a period with a capacity of 2.
func burstPool(limit uint64, period time.Duration, n int, demand float64, q uint32) (*pool, []*member) {
	now := time.Unix(1_700_000_040, 0)
	p := &pool{key: "k", rule: limiter.Rule{Algorithm: limiter.FixedWindow, Limit: limit, Period: period}, members: map[*member]struct{}{}, frac: 1}
	var ms []*member
	for range n {
		b := &bucket{demand: demand, sentKind: kindLimited, sentQ: q, sentF: int64(period / time.Second), sentCap: 2, sent: now}
		l := newLedger(period)
		l.burst, l.sent = 2, 2
		m := &member{b: b, p: p, l: l}
		b.members = []*member{m}
		p.members[m] = struct{}{}
		ms = append(ms, m)
	}
	return p, ms
}

// A round at once sends at most maxLowered lowered grants beside its own
// buckets, however large the pool: the rest wait for the push.
func TestLoweredIsBounded(t *testing.T) {
	p := &pool{rule: limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 30, Period: time.Second}, members: map[*member]struct{}{}, frac: 1}
	var all []*bucket
	for range 3 * maxLowered {
		b := &bucket{kind: kindLimited, sentKind: kindLimited, sentQ: 5, sentF: 1}
		m := &member{b: b, p: p}
		b.members = []*member{m}
		p.members[m] = struct{}{}
		all = append(all, b) // every one holds 5 and is planned none: lowered
	}
	if got := len(lowered(all[:1])); got != maxLowered {
		t.Errorf("%d lowered grants beside one new bucket in a pool of %d, want %d", got, len(all), maxLowered)
	}
}
