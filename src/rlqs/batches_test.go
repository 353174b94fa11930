package rlqs

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

// TestBatches: a round's asks are cut into batches of about maxBatch, each
// key's asks together and in order, and nothing lost or repeated; so the
// batches decide as one store call would.
func TestBatches(t *testing.T) {
	for _, tc := range []struct{ asks, keys, max int }{
		{10, 3, 128}, {500, 500, 128}, {500, 7, 128}, {1000, 1, 128}, {300, 150, 10}, {129, 129, 128},
	} {
		rng := rand.New(rand.NewPCG(uint64(tc.asks), uint64(tc.keys)))
		var asks []*ask
		for i := range tc.asks {
			asks = append(asks, &ask{key: fmt.Sprintf("k%d", rng.IntN(tc.keys)), window: int64(i % 2), tokens: uint64(i)})
		}
		got := batches(asks, tc.max)
		var flat []*ask
		batchOf := map[string]int{}
		for bi, b := range got {
			if len(b) == 0 {
				t.Fatalf("%+v: an empty batch", tc)
			}
			keys := map[string]bool{}
			for _, a := range b {
				k := limiter.WindowKey(a.key, a.window)
				if prev, ok := batchOf[k]; ok && prev != bi {
					t.Fatalf("%+v: key %s in batches %d and %d", tc, k, prev, bi)
				}
				batchOf[k], keys[k] = bi, true
			}
			if len(b) > tc.max && len(keys) > 1 {
				t.Fatalf("%+v: batch %d holds %d asks of %d keys, past %d", tc, bi, len(b), len(keys), tc.max)
			}
			flat = append(flat, b...)
		}
		if len(flat) != len(asks) {
			t.Fatalf("%+v: %d asks in the batches, want %d", tc, len(flat), len(asks))
		}
		// Each key's asks keep their order.
		for k := range batchOf {
			of := func(as []*ask) []*ask {
				return slices.DeleteFunc(slices.Clone(as), func(a *ask) bool { return limiter.WindowKey(a.key, a.window) != k })
			}
			if !slices.Equal(of(flat), of(asks)) {
				t.Fatalf("%+v: key %s's asks reordered", tc, k)
			}
		}
		if tc.asks > tc.max && tc.keys >= tc.asks && len(got) < tc.asks/tc.max {
			t.Errorf("%+v: %d batches", tc, len(got))
		}
	}
}

// BatchRecorder is a store that records the most hits it was asked at
// once; exported for this package's external tests too.
type BatchRecorder struct {
	limiter.Store
	mu      sync.Mutex
	largest int
}

func (r *BatchRecorder) Apply(ctx context.Context, b limiter.Batch) ([]limiter.Outcome, error) {
	r.mu.Lock()
	r.largest = max(r.largest, len(b.Hits))
	r.mu.Unlock()
	return r.Store.Apply(ctx, b)
}

// Largest is the most hits asked at once so far.
func (r *BatchRecorder) Largest() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.largest
}

// TestDemandExchangedInSmallBatches: a full round publishes and reads
// every pool's demand; over 2,000 pools that too is done in store calls of
// at most maxBatch keys, and every pool gets its part. (One call held all
// of them: TestRoundsAskInSmallBatches failed under the race detector when
// a full round came before it ended.)
func TestDemandExchangedInSmallBatches(t *testing.T) {
	rec := &BatchRecorder{Store: limiter.NewMemoryStore(limiter.MemoryOptions{})}
	s := New(Options{Store: rec})
	for i := range 2000 {
		key := fmt.Sprintf("k%d", i)
		p := &pool{key: key, rule: limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 100, Period: time.Second},
			members: map[*member]struct{}{}, frac: 0.5}
		b := &bucket{demand: 5}
		p.members[&member{b: b, p: p}] = struct{}{}
		owned(t, s, func(g *state) { g.pools[key] = p })
	}
	s.exchangeDemand(context.Background(), time.Unix(1_700_000_000, 0))
	if n := rec.Largest(); n == 0 || n > maxBatch {
		t.Errorf("the largest store call held %d keys, want 1 to %d", n, maxBatch)
	}
	var pools map[string]*pool
	owned(t, s, func(g *state) { pools = g.pools })
	for key, p := range pools {
		if p.frac != 1 {
			t.Fatalf("pool %s: part %v, want 1 (the only replica)", key, p.frac)
		}
	}
}
