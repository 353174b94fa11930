// Package memtrim keeps the process's memory in check: it gives memory back
// to the operating system after a spike (Run), reads the container's
// memory limit so that Go's can be set below it (cgroupLimit; Manage does
// both), and tightens the collector while a config loads (DuringLoad).
//
// The service runs with a high GOGC (cmd/server), so after a burst of large
// or many concurrent requests the heap it grew stays resident: with little
// allocation afterwards no collection runs for minutes, and until one runs
// the runtime cannot return the pages. Run watches the heap from one
// goroutine and, when the process has been quiet (no collection during a
// whole interval) while holding well more heap than was live at the last
// collection, forces a collection and returns the free pages
// (debug.FreeOSMemory). A busy process collects on its own and is left
// alone. It sits beside the request path, never on it, and imports nothing
// of the service.
package memtrim

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// options configures run. The zero value is usable.
type options struct {
	// Interval is how often the heap is looked at; 0 means 5s.
	Interval time.Duration
	// Slack is how much more than the live heap may stay resident before a
	// quiet process is trimmed; 0 means 32 MiB.
	Slack uint64
	// OnTrim, when set, hears of each trim with the bytes held before it.
	OnTrim func(held uint64)
	// Follow, when not 0, keeps Go's soft memory limit at twice the live
	// heap, and at least Follow bytes, from one look to the next (for a
	// process that has no limit of its own: see followLimit).
	Follow uint64
}

// followLimit is the soft memory limit Follow sets for a live heap of
// live bytes: twice it, at least floor. With a high GOGC the heap grows to
// several times what is live before a collection, so a burst of large
// requests held hundreds of MB that a process with a few dozen live never
// needed; under this limit the collector runs sooner instead, and a heap
// that truly grows raises the limit at the next look.
func followLimit(live, floor uint64) int64 {
	return int64(max(2*live, floor))
}

// sample is what one look at the heap sees.
type sample struct {
	Cycles uint64 // completed GC cycles
	Live   uint64 // heap bytes live at the last collection
	Held   uint64 // heap and stack bytes held from the OS, not released
}

var names = []string{
	"/gc/cycles/total:gc-cycles",
	"/gc/heap/live:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes",
	"/memory/classes/heap/free:bytes",
	"/memory/classes/heap/stacks:bytes",
}

// read samples the runtime's own counters.
func read() sample {
	s := make([]metrics.Sample, len(names))
	for i, n := range names {
		s[i].Name = n
	}
	metrics.Read(s)
	v := func(i int) uint64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return s[i].Value.Uint64()
	}
	return sample{Cycles: v(0), Live: v(1), Held: v(2) + v(3) + v(4) + v(5)}
}

// shouldTrim reports whether a process that looked like prev one interval
// ago and like cur now is holding memory it no longer uses: no collection
// ran in between (nothing else will return the memory soon) and it holds
// more than slack beyond the live heap.
func shouldTrim(prev, cur sample, slack uint64) bool {
	return cur.Cycles == prev.Cycles && cur.Held > cur.Live+slack
}

// run trims as described in the package doc until ctx ends.
func run(ctx context.Context, o options) {
	if o.Interval <= 0 {
		o.Interval = 5 * time.Second
	}
	if o.Slack == 0 {
		o.Slack = 32 << 20
	}
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	prev := read()
	if o.Follow > 0 {
		debug.SetMemoryLimit(followLimit(prev.Live, o.Follow))
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur := read()
		if shouldTrim(prev, cur, o.Slack) {
			// Twice: the first collection moves pooled buffers (sync.Pool,
			// gRPC's buffer pool) to their victim caches, the second frees
			// them.
			debug.FreeOSMemory()
			debug.FreeOSMemory()
			if o.OnTrim != nil {
				o.OnTrim(cur.Held)
			}
			cur = read()
		}
		if o.Follow > 0 {
			debug.SetMemoryLimit(followLimit(cur.Live, o.Follow))
		}
		prev = cur
	}
}

// limitTo lowers Go's soft memory limit to bytes, unless it is already
// lower, and returns the function that puts the previous limit back.
func limitTo(bytes int64) (restore func()) {
	prev := debug.SetMemoryLimit(-1) // reads it
	if bytes <= 0 || bytes >= prev {
		return func() {}
	}
	debug.SetMemoryLimit(bytes)
	return func() { debug.SetMemoryLimit(prev) }
}
