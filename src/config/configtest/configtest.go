// Package configtest holds what the config package's tests and the
// integration tests both build: request descriptors and atomically
// swapped links.
package configtest

import (
	"os"
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
