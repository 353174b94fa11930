package memtrim

import (
	"context"
	"io/fs"
	"runtime/debug"

	"github.com/sirupsen/logrus"
)

// Manage sets Go's memory limit from the container's (unless GOMEMLIMIT
// is set: gomemlimitSet), so that near it the collector works harder
// instead of the process being killed and the embedded store losing its
// counters; without either, it keeps the limit at twice the live heap (at
// least followFloor), so that bursts of large requests cannot grow the
// heap to GOGC's several times what is live. It gives memory back to the
// OS after a spike until ctx ends. root is the file system the cgroup
// files are read from (os.DirFS("/")).
func Manage(ctx context.Context, log logrus.FieldLogger, root fs.FS, gomemlimitSet bool) {
	var follow uint64
	if !gomemlimitSet {
		if limit, ok := cgroupLimit(root); ok {
			debug.SetMemoryLimit(softLimit(limit))
			log.WithField("limit_mib", softLimit(limit)>>20).Info("Go memory limit set to 90% of the container's")
		} else {
			follow = followFloor
			log.WithField("floor_mib", followFloor>>20).Info("Go memory limit follows the live heap: twice it, at least the floor")
		}
	}
	go run(ctx, options{Follow: follow, OnTrim: func(held uint64) {
		log.WithField("held_mib", held>>20).Debug("returned memory to the OS after a quiet spell")
	}})
}

// followFloor is the least the followed memory limit is: far above what
// the service holds with a config of thousands of rules, so that it rarely
// binds outside bursts.
const followFloor = 256 << 20

// loadGCPercent is the collector's target while a config loads. Loading
// 100,000 rules makes garbage several times the config's size (yaml.v3's
// node trees); at the service's GOGC of 400 the heap could grow to five
// times what is live before a collection, peaks measured in
// docs/configuration.md ("config at scale").
const loadGCPercent = 100

// DuringLoad runs load with the collector at loadGCPercent, unless GOGC
// asks for less (or off), and puts it back after. A reload (serving: a
// config is being served, and stays in memory while the new one loads)
// also runs under a soft memory limit of twice what the process holds
// when it starts (at least 64 MiB more), unless a lower one is set: the
// collector then works harder rather than let the two configs and the
// load's garbage take three times the settled memory
// (docs/configuration.md). Soft: a new config larger than that is still
// loaded, more slowly.
func DuringLoad(serving bool, load func()) {
	prev := debug.SetGCPercent(loadGCPercent)
	defer debug.SetGCPercent(prev)
	if prev < 0 || prev <= loadGCPercent {
		debug.SetGCPercent(prev)
	}
	if serving {
		held := int64(read().Held)
		restore := limitTo(max(2*held, held+64<<20))
		defer restore()
	}
	load()
}
