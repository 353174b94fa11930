package limiter_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

// TestWindowsAreNumberedAsBefore pins the window numbers and per-window
// names every store and RLQS count under: the numbers the stores wrote
// before there was one function for them (nanoseconds since the epoch over
// the period), so that keys in force keep their counts across an upgrade.
// Each window holds its instant, from its start to its end.
func TestWindowsAreNumberedAsBefore(t *testing.T) {
	at := time.Unix(1_700_000_000, 300_000_000)
	for _, tc := range []struct {
		period time.Duration
		want   int64
	}{
		{time.Second, 1_700_000_000},
		{time.Minute, 28_333_333},
		{time.Hour, 472_222},
		{24 * time.Hour, 19_675},
		{7 * 24 * time.Hour, 2_810},
		{15 * time.Second, 113_333_333},
	} {
		r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 1, Period: tc.period}
		w, end := limiter.FixedWindowAt(at, r)
		if w != tc.want {
			t.Errorf("period %v: window %d, want %d", tc.period, w, tc.want)
		}
		if start := limiter.WindowStart(w, r); start.After(at) || !end.After(at) || end.Sub(start) != tc.period {
			t.Errorf("period %v: window %d runs %v to %v, which does not hold %v for one period", tc.period, w, start, end, at)
		}
		if got, want := limiter.WindowKey("k", w), "k\x00rlqs\x00"+strconv.FormatInt(tc.want, 10); got != want {
			t.Errorf("period %v: window key %q, want %q", tc.period, got, want)
		}
	}
}
