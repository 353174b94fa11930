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

// TestSharedWindowsNeedTheClock: counting on the quota service's window
// counters names windows by the clock it names them by, which the wiring
// must pass; there is no hidden process clock to fall back on.
func TestSharedWindowsNeedTheClock(t *testing.T) {
	cur := configs(t, "test.yaml", testConfig)
	if _, err := New(Options{Store: &nowRecorder{}, Configs: cur, SharedWindows: true, Logger: quietLogger()}); err == nil {
		t.Fatal("SharedWindows without Now was accepted")
	}
	rec := &nowRecorder{}
	s, err := New(Options{Store: rec, Configs: cur, SharedWindows: true, Now: func() time.Time { return t0 }, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ShouldRateLimit(context.Background(), req("web", d("ip=1"))); err != nil {
		t.Fatal(err)
	}
	if got := rec.last.Load(); got == nil || !got.Equal(t0) {
		t.Errorf("Batch.Now = %v, want the passed clock's %v", got, t0)
	}
}
