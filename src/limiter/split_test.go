package limiter_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/limiter/limitertest"
)

// recordingStore remembers the keys it was asked about.
type recordingStore struct {
	limiter.Store
	keys []string
}

func (r *recordingStore) Apply(ctx context.Context, b limiter.Batch) ([]limiter.Outcome, error) {
	for _, h := range b.Hits {
		r.keys = append(r.keys, h.Key)
	}
	return r.Store.Apply(ctx, b)
}

func TestSplitRoutesPerSecondRules(t *testing.T) {
	fast := &recordingStore{Store: newMemory(t, limiter.MemoryOptions{})}
	slow := &recordingStore{Store: newMemory(t, limiter.MemoryOptions{})}
	s := limiter.Split{PerSecond: fast, Other: slow}
	sec := limiter.Rule{Limit: 1, Period: time.Second}
	min := limiter.Rule{Limit: 5, Period: time.Minute}
	thirty := limiter.Rule{Limit: 5, Period: 30 * time.Second}
	hits := []limiter.Hit{{Key: "a", Rule: min, Cost: 1}, {Key: "b", Rule: sec, Cost: 1}, {Key: "c", Rule: thirty, Cost: 1}, {Key: "d", Rule: sec, Cost: 2}}
	outs, err := s.Apply(context.Background(), limiter.Batch{Now: limitertest.T0, Hits: hits})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmtKeys(fast.keys); got != "b d" {
		t.Errorf("per-second store got %q, want b d", got)
	}
	if got := fmtKeys(slow.keys); got != "a c" {
		t.Errorf("other store got %q, want a c", got)
	}
	// Outcomes come back in request order: a 4 left, b 0 left, c 4 left, d rejected.
	want := []struct {
		allowed bool
		rem     uint64
	}{{true, 4}, {true, 0}, {true, 4}, {false, 1}}
	for i, w := range want {
		if outs[i].Allowed != w.allowed || outs[i].Remaining != w.rem {
			t.Errorf("outcome %d = %+v, want allowed %v remaining %d", i, outs[i], w.allowed, w.rem)
		}
	}
}

func fmtKeys(keys []string) string { return strings.Join(keys, " ") }
