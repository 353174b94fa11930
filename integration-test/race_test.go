//go:build race

package integration

// raceBuild: this test binary runs under the race detector (make check).
const raceBuild = true
