package memtrim

import (
	"bufio"
	"bytes"
	"io/fs"
	"path"
	"strconv"
	"strings"
)

// cgroupLimit returns the memory limit of the cgroup the process runs in,
// read from fsys (the root file system: os.DirFS("/") in production), and
// whether there is one. It understands cgroup v2 (memory.max) and v1
// (memory.limit_in_bytes), both at the process's own cgroup path from
// /proc/self/cgroup and at the mount root (a container's cgroup namespace
// shows its own cgroup there).
func cgroupLimit(fsys fs.FS) (int64, bool) {
	self, _ := fs.ReadFile(fsys, "proc/self/cgroup")
	var candidates []string
	sc := bufio.NewScanner(bytes.NewReader(self))
	for sc.Scan() {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			candidates = append(candidates, path.Join("sys/fs/cgroup", parts[2], "memory.max"))
		case strings.Contains(","+parts[1]+",", ",memory,"):
			candidates = append(candidates, path.Join("sys/fs/cgroup/memory", parts[2], "memory.limit_in_bytes"))
		}
	}
	candidates = append(candidates, "sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory/memory.limit_in_bytes")
	for _, c := range candidates {
		data, err := fs.ReadFile(fsys, c)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(data))
		if s == "max" {
			return 0, false
		}
		n, err := strconv.ParseInt(s, 10, 64)
		// v1 reports "no limit" as a huge number near 2^63.
		if err != nil || n <= 0 || n >= 1<<62 {
			return 0, false
		}
		return n, true
	}
	return 0, false
}

// softLimit is the Go memory limit for a cgroup limit: nine tenths of it, leaving room
// for what the Go runtime does not count (stacks of threads, the binary).
func softLimit(cgroup int64) int64 { return cgroup / 10 * 9 }
