package limiter_test

import (
	"context"
	"fmt"
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
	for i := range 10_000 {
		key := "k" + string(rune('a'+i%26)) + string(rune(i))
		if _, err := s.Apply(context.Background(), limiter.Batch{Now: limitertest.T0, Hits: []limiter.Hit{{Key: key, Rule: r, Cost: 1}}}); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.Len(); got > 64*4 {
		t.Errorf("Len() = %d after 10000 keys, want at most MaxKeys=%d", got, 64*4)
	}
	if s.Evictions() == 0 {
		t.Errorf("Evictions() = 0, want > 0 after overfilling")
	}
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
// bytes, and the live heap with them), evicting to make room, and evictions
// of live counters are counted.
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
			if _, err := s.Apply(context.Background(), limiter.Batch{Now: now, Hits: []limiter.Hit{{Key: fmt.Sprintf("k%03d", k), Rule: r, Cost: 1}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if got := s.Bytes(); got > maxBytes {
		t.Errorf("Bytes() = %d after 200 full logs, want at most MaxBytes %d", got, maxBytes)
	}
	if s.Evictions() == 0 {
		t.Error("no eviction: 200 logs of 1,000 entries (about 3.2 MB at 16 bytes each, more with growth room) did not fill 4 MiB")
	}
	if live := int64(after.HeapAlloc) - int64(before.HeapAlloc); live > 2*maxBytes {
		t.Errorf("live heap grew by %d bytes, want within twice MaxBytes (%d)", live, 2*maxBytes)
	} else {
		t.Logf("accounted %d bytes, live heap +%d bytes, %d evictions", s.Bytes(), live, s.Evictions())
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
