package main

import (
	"context"
	"os"
	"runtime/debug"

	"github.com/sirupsen/logrus"

	"github.com/openrls/ratelimit/src/memtrim"
)

// manageMemory sets Go's memory limit from the container's (unless
// GOMEMLIMIT is set), so that near it the collector works harder instead of
// the process being killed and the embedded store losing its counters, and
// gives memory back to the OS after a spike until ctx ends.
func manageMemory(ctx context.Context, log logrus.FieldLogger) {
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		if limit, ok := memtrim.CgroupLimit(os.DirFS("/")); ok {
			debug.SetMemoryLimit(memtrim.SoftLimit(limit))
			log.WithField("limit_mib", memtrim.SoftLimit(limit)>>20).Info("Go memory limit set to 90% of the container's")
		}
	}
	go memtrim.Run(ctx, memtrim.Options{OnTrim: func(held uint64) {
		log.WithField("held_mib", held>>20).Debug("returned memory to the OS after a quiet spell")
	}})
}
