package config

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

func flowConfig(exact, wild int) []byte {
	var b strings.Builder
	b.WriteString("domain: scale\ndescriptors:\n")
	for i := range exact {
		fmt.Fprintf(&b, "  - {key: user, value: tenant-%d, rate_limit: {unit: minute, requests_per_unit: %d}}\n", i, 100+i%7)
	}
	for i := range wild {
		fmt.Fprintf(&b, "  - {key: user, value: org-%d-*, rate_limit: {unit: minute, requests_per_unit: %d}}\n", i, 50+i%5)
	}
	b.WriteString("  - {key: user, rate_limit: {unit: minute, requests_per_unit: 10}}\n")
	return []byte(b.String())
}

func TestZZScale(t *testing.T) {
	data := flowConfig(80_000, 20_000)
	t.Logf("file %d bytes", len(data))
	debug.SetGCPercent(-1)
	var m0, m1, m2 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	t0 := time.Now()
	f, err := Parse("scale.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	runtime.ReadMemStats(&m1)
	c, err := Build([]*File{f}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t2 := time.Now()
	runtime.ReadMemStats(&m2)
	f = nil
	debug.SetGCPercent(100)
	runtime.GC()
	var m3 runtime.MemStats
	runtime.ReadMemStats(&m3)
	t.Logf("parse %v (alloc %d MB), build %v (alloc %d MB), settled heap %d MB", t1.Sub(t0), (m1.TotalAlloc-m0.TotalAlloc)>>20, t2.Sub(t1), (m2.TotalAlloc-m1.TotalAlloc)>>20, (m3.HeapAlloc-m0.HeapAlloc)>>20)
	runtime.KeepAlive(c)
}
