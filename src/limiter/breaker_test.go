package limiter_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

// flakyStore fails while down is set and counts the calls that reach it.
type flakyStore struct {
	down  atomic.Bool
	calls atomic.Int64
}

func (f *flakyStore) Apply(_ context.Context, b limiter.Batch) ([]limiter.Outcome, error) {
	f.calls.Add(1)
	if f.down.Load() {
		return nil, errors.New("connection refused")
	}
	return make([]limiter.Outcome, len(b.Hits)), nil
}

func TestBreakerOpensProbesAndCloses(t *testing.T) {
	st := &flakyStore{}
	changes := make(chan bool, 4)
	var probeOK atomic.Bool
	br := limiter.NewBreaker(st, limiter.BreakerOptions{Failures: 3, ProbeInterval: 5 * time.Millisecond,
		Probe: func(context.Context) error {
			if probeOK.Load() {
				return nil
			}
			return errors.New("still down")
		},
		OnChange: func(open bool) { changes <- open }})
	defer br.Close()
	ctx := context.Background()
	st.down.Store(true)
	for i := range 3 {
		if _, err := br.Apply(ctx, limiter.Batch{}); err == nil || errors.Is(err, limiter.ErrBreakerOpen) {
			t.Fatalf("call %d: error = %v, want the store's own error", i, err)
		}
	}
	if open := <-changes; !open || !br.Open() {
		t.Fatal("breaker did not open after 3 failures in a row")
	}
	before := st.calls.Load()
	for range 100 {
		if _, err := br.Apply(ctx, limiter.Batch{}); !errors.Is(err, limiter.ErrBreakerOpen) {
			t.Fatalf("open breaker: error = %v, want ErrBreakerOpen", err)
		}
	}
	if st.calls.Load() != before {
		t.Errorf("an open breaker let %d calls through", st.calls.Load()-before)
	}
	st.down.Store(false)
	probeOK.Store(true)
	select {
	case open := <-changes:
		if open {
			t.Fatal("breaker opened again instead of closing")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("breaker did not close within 10s of the probe succeeding")
	}
	if _, err := br.Apply(ctx, limiter.Batch{}); err != nil {
		t.Errorf("closed breaker: %v", err)
	}
}

func TestBreakerIgnoresCallerCancellation(t *testing.T) {
	st := &flakyStore{}
	st.down.Store(true)
	br := limiter.NewBreaker(st, limiter.BreakerOptions{Failures: 2, Probe: func(context.Context) error { return nil }})
	defer br.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 10 {
		_, _ = br.Apply(ctx, limiter.Batch{})
	}
	if br.Open() {
		t.Error("cancelled calls opened the breaker")
	}
}

func TestBreakerResetsOnSuccess(t *testing.T) {
	st := &flakyStore{}
	br := limiter.NewBreaker(st, limiter.BreakerOptions{Failures: 3, Probe: func(context.Context) error { return nil }})
	defer br.Close()
	for i := range 20 {
		st.down.Store(i%3 != 2) // two failures, then a success, repeatedly
		_, _ = br.Apply(context.Background(), limiter.Batch{})
	}
	if br.Open() {
		t.Error("breaker opened although failures were never 3 in a row")
	}
}
