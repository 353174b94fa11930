package integration

import (
	"flag"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// rlqsPin gives BenchmarkRLQSChurn's service a CPU of its own.
var rlqsPin = flag.Bool("rlqs.pin", true, "BenchmarkRLQSChurn: run the service on CPU 0 alone and this process and the caller's on the others")

// pinSelf runs every thread of this process (and so the processes it
// starts after) on cpus ("1-3", taskset's form) until the returned func
// restores the CPUs each thread had. Linux sets affinity per thread, and
// a new thread takes its creator's, so every thread now is set.
func pinSelf(t testing.TB, cpus string) (restore func()) {
	t.Helper()
	var want unix.CPUSet
	lo, hi, _ := strings.Cut(cpus, "-")
	from, err1 := strconv.Atoi(lo)
	to, err2 := strconv.Atoi(hi)
	if err1 != nil || err2 != nil {
		t.Fatalf("pinSelf: %q is not a CPU range", cpus)
	}
	for c := from; c <= to; c++ {
		want.Set(c)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	old := map[int]unix.CPUSet{}
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		if err != nil {
			continue
		}
		var was unix.CPUSet
		if unix.SchedGetaffinity(tid, &was) != nil {
			continue // the thread ended
		}
		if unix.SchedSetaffinity(tid, &want) == nil {
			old[tid] = was
		}
	}
	return func() {
		var all unix.CPUSet
		for _, was := range old {
			for c := range 1024 {
				if was.IsSet(c) {
					all.Set(c)
				}
			}
		}
		tasks, _ := os.ReadDir("/proc/self/task")
		for _, task := range tasks {
			if tid, err := strconv.Atoi(task.Name()); err == nil {
				_ = unix.SchedSetaffinity(tid, &all)
			}
		}
	}
}
