package memtrim

import (
	"testing"
	"testing/fstest"
)

func TestCgroupLimit(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  int64
		ok    bool
	}{
		{"v2 in a container", map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "268435456\n"}, 268435456, true},
		{"v2 unlimited", map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "max\n"}, 0, false},
		{"v2 at the process's own path", map[string]string{"proc/self/cgroup": "0::/kubepods/pod1/c1\n",
			"sys/fs/cgroup/kubepods/pod1/c1/memory.max": "536870912\n", "sys/fs/cgroup/memory.max": "max\n"}, 536870912, true},
		{"v1", map[string]string{"proc/self/cgroup": "4:memory:/docker/abc\n1:cpu:/\n",
			"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "1073741824\n"}, 1073741824, true},
		{"v1 unlimited", map[string]string{"proc/self/cgroup": "4:memory:/\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0, false},
		{"v1 mount root when the path is not visible", map[string]string{"proc/self/cgroup": "4:cpuacct,memory:/x\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes": "104857600\n"}, 104857600, true},
		{"no cgroup files", map[string]string{}, 0, false},
		{"garbage", map[string]string{"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "lots\n"}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fsys := fstest.MapFS{}
			for name, body := range tc.files {
				fsys[name] = &fstest.MapFile{Data: []byte(body)}
			}
			got, ok := cgroupLimit(fsys)
			if got != tc.want || ok != tc.ok {
				t.Errorf("cgroupLimit() = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
