package rlqs

import (
	"context"
	"math"
	"runtime"
	"strconv"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

// demandScale counts demand in thousandths of a request per second.
const demandScale = 1000

// demandCeiling is the limit of a demand counter: the largest a store
// takes, far above any sum (4 million requests per second), so publishing
// is never refused and Remaining tells what was published.
const demandCeiling = limiter.MaxLimit

// exchangeDemand shares each pool's demand with the other replicas through
// the store, and sets every pool's part of the limit by it. Each replica
// adds its pool's demand to a counter of the current push window, and
// reads the previous window's total, which every replica had published to
// by then: the replica's part is what it published to that window over
// that total. Within a replica, shares are max-min fair (fill); across
// replicas, proportional to demand. A replica alone reads back its own
// demand: the whole limit. When the store fails, the parts stay as they
// were.
func (s *Service) exchangeDemand(ctx context.Context, now time.Time) {
	type pub struct {
		p    *pool
		key  string
		mine uint64
		// before is what this replica published to the window read; 0
		// when it published nothing there.
		before uint64
	}
	period := s.demandPeriod()
	push := limiter.Rule{Algorithm: limiter.FixedWindow, Period: period}
	w, _ := limiter.FixedWindowAt(now, push)
	var pubs []pub
	if s.do("publishing demand", func(g *state) {
		for _, p := range g.pools {
			perSecond := float64(p.rule.Limit) / p.rule.Period.Seconds()
			d := 0.0
			for m := range p.members {
				d += math.Min(m.want(), perSecond)
			}
			mine := uint64(math.Min(math.Ceil(d*demandScale), demandCeiling/16))
			pubs = append(pubs, pub{p: p, key: p.key + "\x00rlqs-demand", mine: mine, before: p.publish(w, mine)})
		}
	}) != nil || len(pubs) == 0 {
		return
	}
	// Window w's counter is named by w and counted as a fixed window twice
	// as long, at the instant that window starts: every write and the read
	// a window later see one window, and a store that measures its TTL
	// from its own clock keeps the counter two windows from its first
	// write, past the read.
	rule := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: demandCeiling, Period: 2 * period}
	at := func(w int64) time.Time { return limiter.WindowStart(w/2*2, push) }
	add := make([]limiter.Hit, len(pubs))
	read := make([]limiter.Hit, len(pubs))
	for i, pb := range pubs {
		add[i] = limiter.Hit{Key: pb.key + "\x00" + strconv.FormatInt(w, 10), Rule: rule, Cost: pb.mine}
		read[i] = limiter.Hit{Key: pb.key + "\x00" + strconv.FormatInt(w-1, 10), Rule: rule}
	}
	if _, err := s.applyInBatches(ctx, at(w), add); err != nil {
		s.storeError(err)
		return
	}
	outs, err := s.applyInBatches(ctx, at(w-1), read)
	if err != nil {
		s.storeError(err)
		return
	}
	_ = s.do("setting the parts of demand", func(*state) {
		for i, pb := range pubs {
			pb.p.frac = part(pb.mine, pb.before, demandCeiling-outs[i].Remaining)
		}
	})
}

// part is a replica's part of a limit: what it published to the window
// read (before) over that window's total, like against like. Read against
// its demand now instead, a replica alone whose demand had fallen since
// took itself for a part of the limit: 5 Envoys on 300 a minute were
// granted 278 of the 290 tokens every few rounds, and each change of
// grant cost an Envoy the fraction of a token it held. A replica that
// published nothing there (its first round, or demand that just came)
// weighs its demand now against the others'. None now: no part.
func part(mine, before, total uint64) float64 {
	switch {
	case mine == 0:
		return 0
	case before > 0 && total > before:
		return float64(before) / float64(total)
	case before > 0 || total == 0:
		return 1 // alone, or the first round: the store still bounds it
	}
	return float64(mine) / float64(mine+total)
}

// publish notes that this replica adds n to the pool's demand counter of
// push window w, and returns what it added to window w-1's.
func (p *pool) publish(w int64, n uint64) (before uint64) {
	if p.published[1].w != w {
		p.published[0], p.published[1] = p.published[1], published{w: w}
	}
	p.published[1].n += n
	if p.published[0].w == w-1 {
		return p.published[0].n
	}
	return 0
}

// applyInBatches applies hits of distinct keys at now in store calls of at
// most maxBatch, yielding between them, as reserve does: one call over
// thousands of pools would hold the embedded store's locks, or Redis, for
// as long as it takes, and ordinary calls would wait behind it.
func (s *Service) applyInBatches(ctx context.Context, now time.Time, hits []limiter.Hit) ([]limiter.Outcome, error) {
	outs := make([]limiter.Outcome, 0, len(hits))
	for len(hits) > 0 {
		n := min(len(hits), maxBatch)
		part, err := s.o.Store.Apply(ctx, limiter.Batch{Now: now, Hits: hits[:n]})
		if err != nil {
			return nil, err
		}
		outs, hits = append(outs, part...), hits[n:]
		if len(hits) > 0 {
			runtime.Gosched()
		}
	}
	return outs, nil
}

// demandPeriod is the window demand is published in: the push interval,
// in whole seconds, at least one.
func (s *Service) demandPeriod() time.Duration {
	return max(time.Second, s.o.Push.Truncate(time.Second))
}
