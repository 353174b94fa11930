package limiter

import (
	"context"
	"sync"
	"time"
)

// Split sends the hits of per-second rules (a Period of exactly one second)
// to PerSecond and all others to Other (REDIS_PERSECOND). Each side applies
// its part as one batch, concurrently. Under AllOrNothing with hits on both
// sides, both are first checked (DryRun) and counted only if neither
// rejects (or, if only overdraft hits do, only those and the refunds are):
// two stores share no atomic step, so, as across Redis Cluster slots, a
// concurrent request can slip in between check and count. It is safe for
// concurrent use if both stores are.
type Split struct {
	PerSecond, Other Store
}

// Apply implements Store.
func (s Split) Apply(ctx context.Context, b Batch) ([]Outcome, error) {
	var fast, slow []int
	for i := range b.Hits {
		if b.Hits[i].Rule.Period == time.Second {
			fast = append(fast, i)
		} else {
			slow = append(slow, i)
		}
	}
	if len(fast) == 0 {
		return s.Other.Apply(ctx, b)
	}
	if len(slow) == 0 {
		return s.PerSecond.Apply(ctx, b)
	}
	if !b.AllOrNothing || b.DryRun {
		return s.apply(ctx, b, fast, slow)
	}
	return CheckThenCount(b, func(step Step, checked []Outcome) ([]Outcome, error) {
		switch step {
		case StepCheck:
			check := b
			check.DryRun = true
			return s.apply(ctx, check, fast, slow)
		case StepReports:
			return s.applyReports(ctx, b, checked)
		}
		return s.apply(ctx, b, fast, slow)
	})
}

// applyReports counts only the overdraft hits, refunds and rejected
// CountRejected hits of b, whose check (outs) found such a rejection and
// nothing else blocking; the other hits keep their checked outcomes.
func (s Split) applyReports(ctx context.Context, b Batch, outs []Outcome) ([]Outcome, error) {
	part := Batch{Now: b.Now}
	var idx []int
	for i := range b.Hits {
		if b.Hits[i].Reports(outs[i]) {
			idx = append(idx, i)
			part.Hits = append(part.Hits, b.Hits[i])
		}
	}
	got, err := s.Apply(ctx, part)
	if err != nil {
		return nil, err
	}
	for j, i := range idx {
		outs[i] = got[j]
	}
	return outs, nil
}

// apply runs b's hits at fast on PerSecond and those at slow on Other,
// concurrently.
func (s Split) apply(ctx context.Context, b Batch, fast, slow []int) ([]Outcome, error) {
	outs := make([]Outcome, len(b.Hits))
	var wg sync.WaitGroup
	var errFast, errSlow error
	wg.Add(1)
	go func() {
		defer wg.Done()
		errFast = applyPart(ctx, s.PerSecond, b, fast, outs)
	}()
	errSlow = applyPart(ctx, s.Other, b, slow, outs)
	wg.Wait()
	if errFast != nil {
		return nil, errFast
	}
	if errSlow != nil {
		return nil, errSlow
	}
	return outs, nil
}

func applyPart(ctx context.Context, st Store, b Batch, idx []int, outs []Outcome) error {
	part := b
	part.Hits = make([]Hit, len(idx))
	for j, i := range idx {
		part.Hits[j] = b.Hits[i]
	}
	got, err := st.Apply(ctx, part)
	if err != nil {
		return err
	}
	for j, i := range idx {
		outs[i] = got[j]
	}
	return nil
}
