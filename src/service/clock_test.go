package service

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

// nowRecorder is a store that remembers the instant of the last batch.
type nowRecorder struct{ last atomic.Pointer[time.Time] }

func (r *nowRecorder) Apply(_ context.Context, b limiter.Batch) ([]limiter.Outcome, error) {
	r.last.Store(&b.Now)
	return make([]limiter.Outcome, len(b.Hits)), nil
}

// TestStoreGetsItsOwnClockByDefault: as cmd/server builds it (no Now), the
// service hands the store the zero instant, so the Redis store reads Redis's
// clock; only an injected clock reaches the store as an instant.
func TestStoreGetsItsOwnClockByDefault(t *testing.T) {
	cur := configs(t, "test.yaml", testConfig)
	for _, tc := range []struct {
		name string
		now  func() time.Time
		want time.Time
	}{
		{"production: no clock", nil, time.Time{}},
		{"tests: an injected clock", func() time.Time { return t0 }, t0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &nowRecorder{}
			s, err := New(Options{Store: rec, Configs: cur, Now: tc.now, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.ShouldRateLimit(context.Background(), req("web", d("ip=1"))); err != nil {
				t.Fatal(err)
			}
			got := rec.last.Load()
			if got == nil {
				t.Fatal("the store was not called")
			}
			if !got.Equal(tc.want) {
				t.Errorf("Batch.Now = %v, want %v", *got, tc.want)
			}
		})
	}
}
