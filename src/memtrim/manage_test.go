package memtrim

import (
	"context"
	"io"
	"math"
	"runtime/debug"
	"testing"
	"testing/fstest"

	"github.com/sirupsen/logrus"
)

// TestDuringLoad: the collector's target during a load is loadGCPercent
// unless GOGC asks for less or is off, and is put back after; a reload
// also runs under a soft memory limit, put back after.
func TestDuringLoad(t *testing.T) {
	gcPercent := func() int { p := debug.SetGCPercent(-1); debug.SetGCPercent(p); return p }
	before := gcPercent()
	beforeLimit := debug.SetMemoryLimit(-1)
	defer func() { debug.SetGCPercent(before); debug.SetMemoryLimit(beforeLimit) }()
	for _, tc := range []struct {
		name     string
		gogc     int
		serving  bool
		wantLoad int
	}{
		{"GOGC 400: tightened", 400, false, loadGCPercent},
		{"GOGC 50: kept", 50, false, 50},
		{"GOGC off: kept off", -1, false, -1},
		{"a reload: tightened and limited", 400, true, loadGCPercent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetGCPercent(tc.gogc)
			debug.SetMemoryLimit(math.MaxInt64)
			var during int
			var limit int64
			DuringLoad(tc.serving, func() { during, limit = gcPercent(), debug.SetMemoryLimit(-1) })
			if during != tc.wantLoad {
				t.Errorf("GC percent during the load %d, want %d", during, tc.wantLoad)
			}
			if got := gcPercent(); got != tc.gogc {
				t.Errorf("GC percent after the load %d, want %d put back", got, tc.gogc)
			}
			if limited := limit < math.MaxInt64; limited != tc.serving {
				t.Errorf("memory limit during the load %d: limited %v, want %v", limit, limited, tc.serving)
			}
			if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
				t.Errorf("memory limit after the load %d, want it put back", got)
			}
		})
	}
}

// TestManage: the container's limit, read from the cgroup files, sets
// Go's at 90% of it; GOMEMLIMIT set leaves it alone.
func TestManage(t *testing.T) {
	beforeLimit := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(beforeLimit)
	log := logrus.New()
	log.SetOutput(io.Discard)
	root := fstest.MapFS{"sys/fs/cgroup/memory.max": {Data: []byte("1073741824\n")}}
	for _, tc := range []struct {
		name string
		set  bool
		want int64
	}{
		{"from the container", false, softLimit(1 << 30)},
		{"GOMEMLIMIT set", true, math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetMemoryLimit(math.MaxInt64)
			ctx, cancel := context.WithCancel(context.Background())
			Manage(ctx, log, root, tc.set)
			cancel()
			if got := debug.SetMemoryLimit(-1); got != tc.want {
				t.Errorf("memory limit %d, want %d", got, tc.want)
			}
		})
	}
}
