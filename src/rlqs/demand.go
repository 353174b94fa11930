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
// by then: the replica's part is its demand over that total. Within a
// replica, shares are max-min fair (fill); across replicas, proportional
// to demand. A replica alone reads back its own demand: the whole limit.
// When the store fails, the parts stay as they were.
func (s *Service) exchangeDemand(ctx context.Context, now time.Time) {
	type pub struct {
		p    *pool
		key  string
		mine uint64
	}
	var pubs []pub
	s.locked(func() {
		for _, p := range s.pools {
			perSecond := float64(p.rule.Limit) / p.rule.Period.Seconds()
			d := 0.0
			for m := range p.members {
				d += math.Min(m.want(), perSecond)
			}
			pubs = append(pubs, pub{p: p, key: p.key + "\x00rlqs-demand", mine: uint64(math.Min(math.Ceil(d*demandScale), demandCeiling/16))})
		}
	})
	if len(pubs) == 0 {
		return
	}
	// Window w's counter is named by w and counted as a fixed window twice
	// as long, at the instant that window starts: every write and the read
	// a window later see one window, and a store that measures its TTL
	// from its own clock keeps the counter two windows from its first
	// write, past the read.
	period := s.demandPeriod()
	rule := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: demandCeiling, Period: 2 * period}
	w := now.UnixNano() / int64(period)
	at := func(w int64) time.Time { return time.Unix(0, w/2*2*int64(period)) }
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
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, pb := range pubs {
		total := demandCeiling - outs[i].Remaining
		switch {
		case pb.mine == 0:
			pb.p.frac = 0
		case total <= pb.mine:
			pb.p.frac = 1 // alone, or the first round: the store still bounds it
		default:
			pb.p.frac = float64(pb.mine) / float64(total)
		}
	}
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
