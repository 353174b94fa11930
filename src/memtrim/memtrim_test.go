package memtrim

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestShouldTrim(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name      string
		prev, cur sample
		want      bool
	}{
		{"quiet after a spike", sample{Cycles: 7, Live: 4 * mib, Held: 120 * mib}, sample{Cycles: 7, Live: 4 * mib, Held: 120 * mib}, true},
		{"busy: collections run on their own", sample{Cycles: 7, Live: 4 * mib, Held: 120 * mib}, sample{Cycles: 9, Live: 4 * mib, Held: 120 * mib}, false},
		{"quiet and lean", sample{Cycles: 7, Live: 4 * mib, Held: 30 * mib}, sample{Cycles: 7, Live: 4 * mib, Held: 30 * mib}, false},
		{"quiet with a large live heap, little beyond it", sample{Cycles: 7, Live: 500 * mib, Held: 520 * mib}, sample{Cycles: 7, Live: 500 * mib, Held: 520 * mib}, false},
		{"exactly the slack beyond live", sample{Cycles: 1, Live: 4 * mib, Held: 36 * mib}, sample{Cycles: 1, Live: 4 * mib, Held: 36 * mib}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := shouldTrim(tc.prev, tc.cur, 32*mib); got != tc.want {
				t.Errorf("shouldTrim(%+v, %+v, 32 MiB) = %v, want %v", tc.prev, tc.cur, got, tc.want)
			}
		})
	}
}

// TestReadSeesTheHeap: Read's counters are the runtime's (a renamed metric
// would read as zero and silently disable trimming).
func TestReadSeesTheHeap(t *testing.T) {
	runtime.GC()
	s := read()
	if s.Cycles == 0 || s.Live == 0 || s.Held < s.Live {
		t.Errorf("read() = %+v, want cycles and live heap counted and held >= live", s)
	}
}

func TestLimitTo(t *testing.T) {
	orig := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(orig)
	for _, tc := range []struct {
		name          string
		before, bound int64
		during        int64
	}{
		{"lowers a higher limit", 1 << 30, 256 << 20, 256 << 20},
		{"keeps a lower one", 128 << 20, 256 << 20, 128 << 20},
		{"ignores nothing", 1 << 30, 0, 1 << 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetMemoryLimit(tc.before)
			restore := limitTo(tc.bound)
			if got := debug.SetMemoryLimit(-1); got != tc.during {
				t.Errorf("limit during = %d, want %d", got, tc.during)
			}
			restore()
			if got := debug.SetMemoryLimit(-1); got != tc.before {
				t.Errorf("limit after = %d, want %d back", got, tc.before)
			}
		})
	}
}

// TestFollowLimit: twice the live heap, never under the floor.
func TestFollowLimit(t *testing.T) {
	for _, tc := range []struct {
		live, floor uint64
		want        int64
	}{
		{10 << 20, 256 << 20, 256 << 20},
		{200 << 20, 256 << 20, 400 << 20},
		{0, 256 << 20, 256 << 20},
	} {
		if got := followLimit(tc.live, tc.floor); got != tc.want {
			t.Errorf("followLimit(%d MiB, %d MiB) = %d MiB, want %d MiB", tc.live>>20, tc.floor>>20, got>>20, tc.want>>20)
		}
	}
}
