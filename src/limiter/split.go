package limiter

import (
	"context"
	"sync"
	"time"
)

// Split sends the hits of per-second rules (a Period of exactly one second)
// to PerSecond and all others to Other (REDIS_PERSECOND). Each side applies
// its part as one batch, concurrently; AllOrNothing holds within each side,
// not across the two. It is safe for concurrent use if both stores are.
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
