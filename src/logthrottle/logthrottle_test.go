package logthrottle

import (
	"sync"
	"testing"
	"time"
)

func TestDue(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name           string
		every          time.Duration
		at             []time.Duration // offsets from t0 of the lines
		want           []bool          // which go out
		wantSuppressed []int64         // the count each line out carries
	}{
		{"the first goes out", 5 * time.Second, []time.Duration{0}, []bool{true}, []int64{0}},
		{"repeats within the interval are held back and counted", 5 * time.Second,
			[]time.Duration{0, time.Second, 4 * time.Second, 5 * time.Second}, []bool{true, false, false, true}, []int64{0, 0, 0, 2}},
		{"the interval counts from the last line out", 5 * time.Second,
			[]time.Duration{0, 6 * time.Second, 10 * time.Second, 11 * time.Second}, []bool{true, true, false, true}, []int64{0, 0, 0, 1}},
		{"zero lets every line through", 0, []time.Duration{0, 0, time.Nanosecond}, []bool{true, true, true}, []int64{0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			th := Throttle{Every: tc.every}
			for i, at := range tc.at {
				n, ok := th.Due(t0.Add(at))
				if ok != tc.want[i] || ok && n != tc.wantSuppressed[i] {
					t.Errorf("line %d at %v: due %v with %d held back, want %v with %d", i, at, ok, n, tc.want[i], tc.wantSuppressed[i])
				}
			}
		})
	}
}

// TestDueRacing: of many lines at one instant, one goes out, and the next
// turn's line counts the rest.
func TestDueRacing(t *testing.T) {
	th := Throttle{Every: time.Second}
	now := time.Unix(1_700_000_000, 0)
	var wg sync.WaitGroup
	var mu sync.Mutex
	out := 0
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, ok := th.Due(now); ok {
				mu.Lock()
				out++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if out != 1 {
		t.Errorf("%d of 64 racing lines went out, want 1", out)
	}
	if n, ok := th.Due(now.Add(time.Second)); !ok || n != 63 {
		t.Errorf("the next turn: due %v with %d held back, want true with 63", ok, n)
	}
}
