// Package configtest holds what the config package's tests and the
// integration tests both build: request descriptors, atomically swapped
// links and ConfigMap layouts.
package configtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// Desc builds a request descriptor from "key=value" pairs.
func Desc(kvs ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d
}

// SwapLink points link at target atomically, as `ln -sfn` and a rename
// do (and as Kubernetes swaps a ConfigMap volume's ..data).
func SwapLink(t testing.TB, target, link string) {
	t.Helper()
	tmp := link + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}

// ConfigMap lays out dir as the kubelet lays out a ConfigMap volume: the
// files in a timestamped directory (stamp), ..data swapped atomically to
// point at it, and a top-level link into ..data for each file.
func ConfigMap(t testing.TB, dir, stamp string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		path := filepath.Join(dir, stamp, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	SwapLink(t, stamp, filepath.Join(dir, "..data"))
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); err != nil {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
}
