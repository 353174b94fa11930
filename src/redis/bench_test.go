package redis

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// BenchmarkApply measures decisions per second through one Redis, with 1 and
// 5 descriptors per request, from parallel callers (b.SetParallelism).
func BenchmarkApply(b *testing.B) {
	srv := redistest.Start(b)
	plain := newStore(b, single(b, srv), Options{})
	batched := newStore(b, single(b, srv), Options{Batch: true})
	for _, tc := range []struct {
		name string
		s    *Store
		n    int
	}{{"descriptors=1", plain, 1}, {"descriptors=5", plain, 5}, {"descriptors=1,batched", batched, 1}, {"descriptors=5,batched", batched, 5}} {
		s, n := tc.s, tc.n
		b.Run(tc.name, func(b *testing.B) {
			r := limiter.Rule{Limit: 1 << 31, Period: time.Hour}
			var seq atomic.Int64
			b.SetParallelism(8)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				hs := hits("bench"+strconv.FormatInt(seq.Add(1), 10)+"_", n, r)
				for pb.Next() {
					if _, err := s.Apply(context.Background(), limiter.Batch{Hits: hs}); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
			// Redis's own time per call of batch.lua, its cost inside Redis.
			if st := commandStats(b, srv)["fcall"]; st.Calls > 0 {
				b.ReportMetric(float64(st.Busy.Microseconds())/float64(st.Calls), "redis-µs/script")
			}
			_, _ = srv.Do("CONFIG", "RESETSTAT")
		})
	}
}

// BenchmarkHotKeyLeased measures one hot key from parallel callers through
// a leased rule, beside the embedded store on the same key: what a
// decision costs the service when slices answer it.
func BenchmarkHotKeyLeased(b *testing.B) {
	srv := redistest.Start(b)
	leased := newStore(b, single(b, srv), Options{Batch: true, LeaseInterval: 50 * time.Millisecond})
	mem := limiter.NewMemoryStore(limiter.MemoryOptions{})
	b.Cleanup(mem.Close)
	r := limiter.Rule{Limit: 1<<32 - 1, Period: time.Hour, Lease: "hot"}
	for _, tc := range []struct {
		name string
		s    limiter.Store
	}{{"embedded", mem}, {"redis,leased", leased}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetParallelism(8)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				hs := []limiter.Hit{{Key: "{hot}:fw3600", Rule: r, Cost: 1}}
				for pb.Next() {
					if _, err := tc.s.Apply(context.Background(), limiter.Batch{Hits: hs}); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
