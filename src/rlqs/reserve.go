package rlqs

import (
	"cmp"
	"context"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

// What a round asks of the store: counts, and refunds, in small batches.

// reserve gives back what back asks (first: a key's give-backs come
// before its counts), counts every job's asks in the store, and notes
// what it refused and, where a grant fell short, what the store could
// still hold.
func (s *Service) reserve(ctx context.Context, back []*ask, jobs []*job) {
	asks := append(back, asksOf(jobs, func(*ask) bool { return true })...)
	s.inBatches(asks, func(at time.Time, batch []*ask) { s.reserveBatch(ctx, at, batch) })
}

// recount gives back what the store counted for the jobs that fell short
// and counts their cut grants, again, in one call per batch: a key's
// give-backs come before its counts.
func (s *Service) recount(ctx context.Context, short, again []*job) {
	asks := asksOf(short, func(a *ask) bool { return a.ok })
	for _, a := range asks {
		a.back = true
	}
	asks = append(asks, asksOf(again, func(*ask) bool { return true })...)
	s.inBatches(asks, func(at time.Time, batch []*ask) { s.reserveBatch(ctx, at, batch) })
}

// asksOf is the asks of jobs that pick chooses.
func asksOf(jobs []*job, pick func(*ask) bool) []*ask {
	var out []*ask
	for _, j := range jobs {
		for _, a := range j.asks {
			if pick(a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// inBatches calls do with asks, one instant and about maxBatch asks at a
// time.
func (s *Service) inBatches(asks []*ask, do func(at time.Time, asks []*ask)) {
	byAt := map[time.Time][]*ask{}
	for _, a := range asks {
		byAt[a.at] = append(byAt[a.at], a)
	}
	for at, all := range byAt {
		for _, batch := range batches(all, maxBatch) {
			do(at, batch)
			// Let the ordinary calls waiting for a processor run between
			// batches: the scheduler would preempt this goroutine only
			// after 10 ms, and on two cores those calls would wait that
			// long behind a round (BenchmarkRLQSChurn).
			runtime.Gosched()
		}
	}
}

// maxBatch is about how many asks go to the store in one call. A round
// over thousands of buckets asks for thousands of keys; in one call they
// would hold the embedded store's locks, or Redis, for as long as they
// take, and every ordinary ShouldRateLimit call would wait behind them
// (BenchmarkRLQSChurn; its figures are in docs/rlqs.md).
const maxBatch = 128

// batches cuts asks into batches of about max, keeping the asks of one
// store key together and in order: a key's later asks see its earlier
// ones within a batch, and asks of different keys are independent, so
// the batches decide as one call would. A stable sort by (key, window)
// groups them without a string or a map per key, which a round over
// thousands of buckets would otherwise allocate.
func batches(asks []*ask, max int) [][]*ask {
	if len(asks) <= max {
		return [][]*ask{asks}
	}
	sorted := slices.Clone(asks)
	slices.SortStableFunc(sorted, func(a, b *ask) int {
		if c := strings.Compare(a.key, b.key); c != 0 {
			return c
		}
		return cmp.Compare(a.window, b.window)
	})
	var out [][]*ask
	start := 0 // where the batch being cut starts
	for i := 0; i < len(sorted); {
		j := i + 1 // the end of the key's asks
		for j < len(sorted) && sorted[j].key == sorted[i].key && sorted[j].window == sorted[i].window {
			j++
		}
		if i > start && j-start > max {
			out, start = append(out, sorted[start:i]), i
		}
		i = j
	}
	return append(out, sorted[start:])
}

// reserveBatch counts one batch of asks in the store, at at, and gives
// back those marked back (a hand-over's have no job). When the store
// fails, the asks' jobs send nothing (refused), and a give-back is taken
// as applied, since whether it was is unknown: the bucket is not credited
// with tokens the store may no longer hold; at worst the store holds some
// that nobody is sent until their window ends.
func (s *Service) reserveBatch(ctx context.Context, at time.Time, asks []*ask) {
	hits := make([]limiter.Hit, len(asks))
	for i, a := range asks {
		hits[i] = limiter.Hit{Key: limiter.WindowKey(a.key, a.window), Rule: a.rule, Cost: a.tokens, Refund: a.back}
	}
	outs, err := s.o.Store.Apply(ctx, limiter.Batch{Now: at, Hits: hits})
	if err != nil {
		s.storeError(err)
	}
	for i, a := range asks {
		switch {
		case a.back:
			a.ok = false
		case err == nil && outs[i].Allowed:
			a.ok = true
		case err == nil:
			a.job.noteShort(a, outs[i].Remaining)
		}
		if err != nil && a.job != nil {
			a.job.refused = true
		}
	}
}

// noteShort records that the store could not hold ask a of j, and what it
// could still hold for j in that window.
func (j *job) noteShort(a *ask, remaining uint64) {
	if j.left == nil {
		j.left = make([]map[int64]uint64, len(j.trials))
	}
	if j.left[a.trial] == nil {
		j.left[a.trial] = map[int64]uint64{}
	}
	j.left[a.trial][a.window] = j.trials[a.trial].wins.get(a.window).held + remaining
	j.failed = true
}
