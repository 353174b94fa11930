package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/limiter/limitertest"
)

var _ limiter.Store = (*limiter.MemoryStore)(nil)

func newMemory(t *testing.T, opts limiter.MemoryOptions) *limiter.MemoryStore {
	t.Helper()
	if opts.SweepInterval == 0 {
		opts.SweepInterval = -1
	}
	s := limiter.NewMemoryStore(opts)
	t.Cleanup(s.Close)
	return s
}

func TestMemoryConformance(t *testing.T) {
	limitertest.Run(t, func(t *testing.T) limiter.Store { return newMemory(t, limiter.MemoryOptions{}) })
}

func TestMemorySweepFreesExpired(t *testing.T) {
	s := newMemory(t, limiter.MemoryOptions{})
	t0 := limitertest.T0
	r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 5, Period: time.Second}
	long := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 5, Period: time.Hour}
	if _, err := s.Apply(context.Background(), limiter.Batch{Now: t0, Hits: []limiter.Hit{{Key: "a", Rule: r, Cost: 1}, {Key: "b", Rule: long, Cost: 1}}}); err != nil {
		t.Fatal(err)
	}
	if got := s.Sweep(t0.Add(999 * time.Millisecond)); got != 0 {
		t.Errorf("Sweep(before expiry) = %d, want 0", got)
	}
	if got := s.Sweep(t0.Add(time.Second)); got != 1 {
		t.Errorf("Sweep(after the 1s window) = %d, want 1", got)
	}
	if got := s.Len(); got != 1 {
		t.Errorf("Len() = %d, want 1 (the hour window)", got)
	}
}

func TestMemoryBoundedWhenFull(t *testing.T) {
	s := newMemory(t, limiter.MemoryOptions{MaxKeys: 64 * 4})
	r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 5, Period: time.Hour}
	refused := 0
	for i := range 10_000 {
		key := "k" + string(rune('a'+i%26)) + string(rune(i))
		_, err := s.Apply(context.Background(), limiter.Batch{Now: limitertest.T0, Hits: []limiter.Hit{{Key: key, Rule: r, Cost: 1}}})
		switch {
		case errors.Is(err, limiter.ErrFull):
			refused++
		case err != nil:
			t.Fatal(err)
		}
	}
	if got := s.Len(); got > 64*4 {
		t.Errorf("Len() = %d after 10000 keys, want at most MaxKeys=%d", got, 64*4)
	}
	if refused == 0 || s.Refused() != uint64(refused) {
		t.Errorf("%d batches refused, Refused() = %d; want some, and the same", refused, s.Refused())
	}
}

// TestMemoryFullKeepsLiveCounters: churning new values through a full
// store never gives an established client its budget back, even when the
// clients' windows are the shorter ones (dropping the counter that expires
// soonest would pick theirs); new keys are refused with ErrFull instead,
// until counters expire, and then get the room the expired ones held.
func TestMemoryFullKeepsLiveCounters(t *testing.T) {
	const clients = 2_000
	s := newMemory(t, limiter.MemoryOptions{MaxBytes: 64 * 64 * 200}) // room for about 8,000 counters
	perMinute := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 3, Period: time.Minute}
	hourly := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 3, Period: time.Hour}
	apply := func(now time.Time, key string, r limiter.Rule) (limiter.Outcome, error) {
		out, err := s.Apply(context.Background(), limiter.Batch{Now: now, Hits: []limiter.Hit{{Key: key, Rule: r, Cost: 1}}})
		if err != nil {
			return limiter.Outcome{}, err
		}
		return out[0], nil
	}
	t0 := limitertest.T0
	// Every client spends its budget for the minute.
	for c := range clients {
		for range 3 {
			if _, err := apply(t0, fmt.Sprintf("client-%d", c), perMinute); err != nil {
				t.Fatalf("client %d: %v", c, err)
			}
		}
	}
	// An attacker churns 150,000 new values on an hourly window, in 12 s.
	refused := 0
	for i := range 150_000 {
		now := t0.Add(time.Duration(i) * 80 * time.Microsecond)
		if _, err := apply(now, fmt.Sprintf("churn-%d", i), hourly); errors.Is(err, limiter.ErrFull) {
			refused++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	back := 0
	for c := range clients {
		out, err := apply(t0.Add(13*time.Second), fmt.Sprintf("client-%d", c), perMinute)
		if err != nil {
			t.Fatalf("client %d: %v", c, err)
		}
		if out.Allowed {
			back++
		}
	}
	if back != 0 {
		t.Errorf("%d of %d limited clients got budget back after the churn, want 0", back, clients)
	}
	if refused == 0 || s.Refused() != uint64(refused) {
		t.Errorf("%d churned keys refused, Refused() = %d: want some, and the same", refused, s.Refused())
	}
	// Once the clients' minute is over, their room goes to new keys (a
	// hundred: each shard freed about 31 clients' counters).
	for i := range 100 {
		if _, err := apply(t0.Add(time.Minute), fmt.Sprintf("late-%d", i), hourly); err != nil {
			t.Fatalf("a new key after the clients' counters expired: %v", err)
		}
	}
	t.Logf("refused %d of 150,000 churned keys", refused)
}

func TestMemoryUsesClockWhenNowIsZero(t *testing.T) {
	at := limitertest.T0.Add(30 * time.Second)
	s := newMemory(t, limiter.MemoryOptions{Clock: func() time.Time { return at }})
	r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 5, Period: time.Minute}
	out, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: "k", Rule: r, Cost: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if out[0].ResetAfter != 30*time.Second {
		t.Errorf("ResetAfter = %v, want 30s (from the injected clock)", out[0].ResetAfter)
	}
}

func BenchmarkMemoryApply(b *testing.B) {
	s := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
	defer s.Close()
	r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 1 << 30, Period: time.Hour}
	hits := []limiter.Hit{{Key: "bench:key", Rule: r, Cost: 1}}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Apply(context.Background(), limiter.Batch{Now: limitertest.T0, Hits: hits}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkMemoryApply3(b *testing.B) {
	s := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
	defer s.Close()
	hits := []limiter.Hit{
		{Key: "bench:a", Rule: limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 1 << 30, Period: time.Hour}, Cost: 1},
		{Key: "bench:b", Rule: limiter.Rule{Algorithm: limiter.SlidingWindow, Limit: 1 << 30, Period: time.Hour}, Cost: 1},
		{Key: "bench:c", Rule: limiter.Rule{Algorithm: limiter.TokenBucket, Limit: 1 << 30, Period: time.Hour}, Cost: 1},
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Apply(context.Background(), limiter.Batch{Now: limitertest.T0, Hits: hits}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestMemoryBoundedByBytes: sliding logs count by their entries, not as one
// key each: filling logs on many keys stays within MaxBytes (the accounted
// bytes, and the live heap with them): past it, hits that would grow a log
// or start a new one are refused, and counted.
func TestMemoryBoundedByBytes(t *testing.T) {
	const maxBytes = 4 << 20
	s := newMemory(t, limiter.MemoryOptions{MaxBytes: maxBytes})
	r := limiter.Rule{Algorithm: limiter.SlidingLog, Limit: 1000, Period: time.Hour}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for k := range 200 {
		for i := range 1000 {
			// One µs apart: every hit is an entry of its own.
			now := limitertest.T0.Add(time.Duration(i) * time.Microsecond)
			_, err := s.Apply(context.Background(), limiter.Batch{Now: now, Hits: []limiter.Hit{{Key: fmt.Sprintf("k%03d", k), Rule: r, Cost: 1}}})
			if err != nil && !errors.Is(err, limiter.ErrFull) {
				t.Fatal(err)
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if got := s.Bytes(); got > maxBytes {
		t.Errorf("Bytes() = %d after 200 full logs, want at most MaxBytes %d", got, maxBytes)
	}
	if s.Refused() == 0 {
		t.Error("nothing refused: 200 logs of 1,000 entries (about 3.2 MB at 16 bytes each, more with growth room) did not fill 4 MiB")
	}
	if live := int64(after.HeapAlloc) - int64(before.HeapAlloc); live > 2*maxBytes {
		t.Errorf("live heap grew by %d bytes, want within twice MaxBytes (%d)", live, 2*maxBytes)
	} else {
		t.Logf("accounted %d bytes, live heap +%d bytes, %d refused", s.Bytes(), live, s.Refused())
	}
}

// TestSlidingLogAppendDoesNotCopy: counting a hit on a sliding log costs
// amortised constant allocation, not a copy of the log per hit.
func TestSlidingLogAppendDoesNotCopy(t *testing.T) {
	s := newMemory(t, limiter.MemoryOptions{})
	r := limiter.Rule{Algorithm: limiter.SlidingLog, Limit: 1000, Period: time.Hour}
	i := 0
	hits := []limiter.Hit{{Key: "k", Rule: r, Cost: 1}}
	allocBytes := func(n int) uint64 {
		var a, b runtime.MemStats
		runtime.ReadMemStats(&a)
		for range n {
			i++
			if _, err := s.Apply(context.Background(), limiter.Batch{Now: limitertest.T0.Add(time.Duration(i) * time.Microsecond), Hits: hits}); err != nil {
				t.Fatal(err)
			}
		}
		runtime.ReadMemStats(&b)
		return b.TotalAlloc - a.TotalAlloc
	}
	allocBytes(100)
	first := allocBytes(100) // log from 100 to 200 entries
	last := allocBytes(100)  // from 800 to 900: a copy per hit would cost 8x the above
	if last > 3*first {
		t.Errorf("100 hits on a log of 800 allocated %d bytes, %d on a log of 100: the log is copied per hit", last, first)
	}
}

// TestMemoryFullStillRefusesLimitedClients: in a full store, a request
// whose existing counter rejects it is answered OVER_LIMIT by that counter
// even when it also names a new value that has no room (it counts
// nothing); a request that nothing rejects gets ErrFull, for the failure
// policy.
func TestMemoryFullStillRefusesLimitedClients(t *testing.T) {
	s := newMemory(t, limiter.MemoryOptions{MaxKeys: 64})
	r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 1, Period: time.Hour}
	apply := func(keys ...string) ([]limiter.Outcome, error) {
		var hits []limiter.Hit
		for _, k := range keys {
			hits = append(hits, limiter.Hit{Key: k, Rule: r, Cost: 1})
		}
		return s.Apply(context.Background(), limiter.Batch{Now: limitertest.T0, Hits: hits})
	}
	// Fill the store until a new key is refused: its shard is full (the
	// store is sharded by a hash seeded per process, so another new key may
	// still find room in another shard).
	var limited, refused string
	for i := 0; ; i++ {
		k := fmt.Sprintf("fill-%d", i)
		if _, err := apply(k); errors.Is(err, limiter.ErrFull) {
			refused = k
			break
		} else if err != nil {
			t.Fatal(err)
		}
		limited = k // at its limit of 1
		if i > 10_000 {
			t.Fatal("the store never filled")
		}
	}
	for i := range 200 {
		fresh := fmt.Sprintf("fresh-%d", i)
		outs, err := apply(limited, fresh)
		if errors.Is(err, limiter.ErrFull) {
			t.Fatalf("a request refused by its own counter got ErrFull (the failure policy would answer it)")
		} else if err != nil {
			t.Fatal(err)
		}
		if outs[0].Allowed {
			t.Fatalf("the limited client was allowed: %+v", outs)
		}
	}
	if _, err := apply(refused); !errors.Is(err, limiter.ErrFull) {
		t.Errorf("a new value alone in a full shard: %v, want ErrFull", err)
	}
}

// TestLargeBatchIsSequential: a batch past the size where the store finds
// a key's earlier writes through a map decides every hit as the same hits
// sent one at a time do, for every algorithm, with refunds and repeated
// keys among many distinct ones.
func TestLargeBatchIsSequential(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	for _, r := range []limiter.Rule{
		{Algorithm: limiter.FixedWindow, Limit: 5, Period: time.Minute},
		{Algorithm: limiter.TokenBucket, Limit: 5, Period: time.Minute},
		{Algorithm: limiter.FixedWindow, Limit: 5, Period: time.Minute, Overdraft: true},
	} {
		for _, size := range []int{20, 33, 300} {
			rng := rand.New(rand.NewPCG(uint64(size), 3))
			hits := make([]limiter.Hit, size)
			for i := range hits {
				hits[i] = limiter.Hit{Key: fmt.Sprintf("k%d", rng.IntN(size/3+1)), Rule: r, Cost: uint64(rng.IntN(3)),
					Refund: rng.IntN(8) == 0}
			}
			batch, err := newMemory(t, limiter.MemoryOptions{}).Apply(context.Background(), limiter.Batch{Now: now, Hits: hits})
			if err != nil {
				t.Fatal(err)
			}
			one := newMemory(t, limiter.MemoryOptions{})
			for i, h := range hits {
				outs, err := one.Apply(context.Background(), limiter.Batch{Now: now, Hits: []limiter.Hit{h}})
				if err != nil {
					t.Fatal(err)
				}
				if outs[0] != batch[i] {
					t.Fatalf("%v, %d hits: hit %d (%s) in the batch %+v, alone %+v", r, size, i, h.Key, batch[i], outs[0])
				}
			}
		}
	}
}
