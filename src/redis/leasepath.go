package redis

import (
	"cmp"
	"context"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

// The leased Apply path: a batch with leased hits is answered from the
// slices this replica holds where they cover it (admitLocally), and the
// rest goes to Redis, asking for slices where they ran out (applyRest);
// slices unused for LeaseIdle go back at the sweep (sweepLeases). The
// slices themselves are in lease.go.

// applyLeased answers what slices hold locally and sends the rest to
// Redis, asking for slices where they ran out.
func (s *Store) applyLeased(ctx context.Context, b limiter.Batch) ([]limiter.Outcome, error) {
	now := b.Now
	if now.IsZero() {
		now = s.clock()
	}
	outs := make([]limiter.Outcome, len(b.Hits))
	uses := make([]leaseUse, len(b.Hits))
	rest, restIdx, backs := s.admitLocally(b, now, outs, uses)
	if len(backs) > 0 {
		// Given back on their own, before the batch and whatever it
		// decides: a slice given back is never wrong to give back.
		if err := s.giveBack(ctx, backs); err != nil {
			s.abandon(b, uses)
			return nil, err
		}
		for _, u := range uses {
			if u.back.n > 0 && u.back.rule == u.sl.rule {
				u.sl.credit(u.back.n)
			}
		}
	}
	if len(rest.Hits) > 0 {
		if err := s.applyRest(ctx, b, rest, restIdx, now, outs, uses); err != nil {
			s.abandon(b, uses)
			return nil, err
		}
	}
	if b.DryRun || b.AllOrNothing && limiter.Decide(b, outs) != limiter.CommitAll {
		uncount(uses, outs, now)
	}
	return outs, nil
}

// admitLocally answers the hits their slices can (into outs) and returns
// the batch of those Redis must decide, their indexes in b, and the
// slices to give back first.
//
// A batch that may count nothing (a dry run, all or nothing) can take
// from a slice and then give that slice back for a later hit: its earlier
// hits then go back with the slice and to Redis with the rest, so that
// Redis decides on everything the slice held, and nothing taken from a
// slice already given back has to come back to it (see putBack).
func (s *Store) admitLocally(b limiter.Batch, now time.Time, outs []limiter.Outcome, uses []leaseUse) (rest limiter.Batch, restIdx []int, backs []sliceReturn) {
	mayUncount := b.DryRun || b.AllOrNothing
	for i := range b.Hits {
		h := &b.Hits[i]
		if h.Rule.Lease == "" {
			continue
		}
		sl := s.leases.get(h, now)
		if sl == nil {
			continue
		}
		out, u := s.leases.admit(h.Key, sl, h, now, b.DryRun, lastOnKey(b.Hits, i))
		if u.local {
			outs[i], uses[i] = out, u
			continue
		}
		if mayUncount && (u.back.n > 0 || u.back.size > 0) {
			for j := range i {
				if t := &uses[j]; t.local && t.sl == sl && t.window == u.back.window {
					u.back.n += t.took
					uses[j], outs[j] = leaseUse{sl: sl}, limiter.Outcome{}
				}
			}
		}
		uses[i] = u
		if u.back.n > 0 || u.back.size > 0 {
			backs = append(backs, u.back)
		}
	}
	rest = limiter.Batch{Now: b.Now, AllOrNothing: b.AllOrNothing, DryRun: b.DryRun}
	for i := range b.Hits {
		if !uses[i].local {
			rest.Hits, restIdx = append(rest.Hits, b.Hits[i]), append(restIdx, i)
		}
	}
	return rest, restIdx, backs
}

// applyRest sends rest (b's hits at restIdx) to Redis, asking for slices
// where uses want them, and folds the answers and the slices granted into
// outs.
func (s *Store) applyRest(ctx context.Context, b limiter.Batch, rest limiter.Batch, restIdx []int, now time.Time, outs []limiter.Outcome, uses []leaseUse) error {
	var wants []uint64
	for j, i := range restIdx {
		if uses[i].want > 0 {
			if wants == nil {
				wants = make([]uint64, len(rest.Hits))
			}
			wants[j] = uses[i].want
		}
	}
	routs, grants, err := s.apply(ctx, rest, wants)
	if err != nil {
		return err
	}
	// In batch order, so that what a hit reports holds the slices
	// granted before it, not after.
	for j, i := range restIdx {
		outs[i] = routs[j]
		u := &uses[i]
		if u.sl == nil {
			continue
		}
		if u.want > 0 {
			var g grant
			if grants != nil {
				g = grants[j]
			}
			s.leases.took(b.Hits[i].Key, u.sl, &b.Hits[i], routs[j], g, true, now)
		}
		u.base = outs[i].Remaining
		outs[i].Remaining += u.sl.observe(outs[i], now)
	}
	return nil
}

// uncount is for a batch that counted nothing (a dry run, or all or
// nothing that came to nothing): what slices answered goes back to them,
// and each allowed hit reports what a cost of 0 sees, what Redis said
// remains beyond the slices plus what its slice now holds (a rejected one
// keeps what it saw when it was decided).
func uncount(uses []leaseUse, outs []limiter.Outcome, now time.Time) {
	for i := range uses {
		uses[i].putBack()
	}
	for i, u := range uses {
		if u.sl == nil || !outs[i].Allowed {
			continue
		}
		remaining, held := u.sl.view(now)
		if u.local {
			u.base = remaining
		}
		outs[i].Remaining = u.base + held
	}
}

// abandon undoes what b's hits did to their slices when Redis could not
// be asked: the calls that were taking slices are over, and what slices
// answered goes back. What was to be given back stays counted.
func (s *Store) abandon(b limiter.Batch, uses []leaseUse) {
	for i, u := range uses {
		if u.want > 0 {
			s.leases.took(b.Hits[i].Key, u.sl, &b.Hits[i], limiter.Outcome{}, grant{}, false, time.Time{})
		}
		u.putBack()
	}
}

// giveBack returns slices to Redis in one round trip: each as a refund
// naming its window (see batch.lua's lease_return).
func (s *Store) giveBack(ctx context.Context, backs []sliceReturn) error {
	b := limiter.Batch{Hits: make([]limiter.Hit, len(backs))}
	params := make([]uint64, len(backs))
	for i, r := range backs {
		// A window algorithm has no burst: the give-back carries the
		// slice's size there, and in the limit, which a give-back does
		// not use, the generation of the record that granted it (see
		// batch.lua's give_back).
		rule := r.rule
		rule.Burst, rule.Limit = r.size, uint64(r.gen)
		b.Hits[i] = limiter.Hit{Key: r.key, Rule: rule, Cost: r.n, Refund: true}
		params[i] = uint64(r.window) + 1
	}
	if _, _, err := s.apply(ctx, b, params); err != nil {
		return err
	}
	for _, r := range backs {
		s.leases.ruleStats(r.rule.Lease).returned.Add(r.n)
	}
	return nil
}

// lastOnKey reports whether hits[i] is the last hit on its key: only that
// one may ask for a slice, which would otherwise take budget from under
// the hits after it in the same call.
func lastOnKey(hits []limiter.Hit, i int) bool {
	for j := i + 1; j < len(hits); j++ {
		if hits[j].Key == hits[i].Key {
			return false
		}
	}
	return true
}

// sweepEvery sweeps the slices every period until ctx ends.
func (s *Store) sweepEvery(ctx context.Context, period time.Duration) {
	defer close(s.swept)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.sweep(s.leases.idle)
		}
	}
}

// sweep gives back the slices unused for idle (every slice when idle is
// 0), within the store's timeout.
func (s *Store) sweep(idle time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(s.timeout, time.Second))
	defer cancel()
	s.sweepLeases(ctx, s.clock(), idle)
}

// sweepLeases gives back the slices unused for idle, and forgets keys
// whose slices are spent and unused as long, then sends every queued
// give-back in one round trip.
func (s *Store) sweepLeases(ctx context.Context, now time.Time, idle time.Duration) {
	l := s.leases
	l.slices.Range(func(k, v any) bool {
		sl := v.(*leaseSlice)
		sl.mu.Lock()
		unused := now.Sub(sl.lastUse) >= idle
		if unused {
			l.queue(k.(string), sl, now)
		}
		// A request that found the slice just before it is forgotten may
		// still take a slice on it: those hits are counted and lost, never
		// admitted twice.
		forget := !sl.taking && sl.left == 0 && unused
		sl.mu.Unlock()
		if forget && l.slices.CompareAndDelete(k, v) {
			l.count.Add(-1)
		}
		return true
	})
	l.mu.Lock()
	returns := l.returns
	l.returns = nil
	l.mu.Unlock()
	if len(returns) > 0 {
		// On failure those hits stay counted, which never admits more.
		_ = s.giveBack(ctx, returns)
	}
}

// LeaseStats reports lease activity per rule (limiter.Rule.Lease); nil
// when leasing is off.
func (s *Store) LeaseStats() map[string]LeaseStats {
	if s.leases == nil {
		return nil
	}
	l := s.leases
	now := l.clock()
	out := map[string]LeaseStats{}
	l.mu.Lock()
	for name, st := range l.stats {
		out[name] = LeaseStats{Slices: st.taken.Load(), Leased: st.leased.Load(), Returned: st.returned.Load()}
	}
	l.mu.Unlock()
	l.slices.Range(func(_, v any) bool {
		sl := v.(*leaseSlice)
		sl.mu.Lock()
		if sl.left > 0 && now.Before(sl.until) {
			st := out[sl.rule.Lease]
			st.Held += sl.left
			out[sl.rule.Lease] = st
		}
		sl.mu.Unlock()
		return true
	})
	return out
}
