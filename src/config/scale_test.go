package config

import (
	"fmt"
	"github.com/openrls/ratelimit/src/config/configtest"
	"runtime"
	"strings"
	"testing"
)

// scaleConfig is a multi-tenant config: one key with exact values, prefix
// wildcards and a key-only default, as issue-size configs have.
func scaleConfig(exact, wild int) []byte {
	var b strings.Builder
	b.WriteString("domain: scale\ndescriptors:\n")
	for i := range exact {
		fmt.Fprintf(&b, "  - key: tenant\n    value: t-%d\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", i, 100+i%7)
	}
	for i := range wild {
		fmt.Fprintf(&b, "  - key: tenant\n    value: org-%d-*\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", i, 50+i%5)
	}
	b.WriteString("  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")
	return []byte(b.String())
}

func buildScale(tb testing.TB, exact, wild int) *Config {
	tb.Helper()
	return mustBuild(tb, string(scaleConfig(exact, wild)))
}

// BenchmarkLoadScale parses and builds 100,000 rules (20,000 wildcards).
func BenchmarkLoadScale(b *testing.B) {
	data := scaleConfig(80_000, 20_000)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		f, err := Parse("scale.yaml", data)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Build([]*File{f}, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMatchScale matches exact hits, wildcard hits and values that
// fall through every wildcard to the default, at 100 and 100,000 rules.
func BenchmarkMatchScale(b *testing.B) {
	for _, size := range []struct {
		name        string
		exact, wild int
	}{{"rules=100", 80, 20}, {"rules=100k", 80_000, 20_000}} {
		c := buildScale(b, size.exact, size.wild)
		d := c.Domain("scale")
		for _, req := range []struct{ name, value string }{
			{"exact", "t-42"}, {"wildcard", "org-17-user-9"}, {"fallthrough", "nobody-at-all"},
		} {
			entries := configtest.Desc("tenant=" + req.value).GetEntries()
			b.Run(size.name+"/"+req.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if d.Match(entries) == nil {
						b.Fatal("no match")
					}
				}
			})
		}
	}
}

// TestScaleMemory reports the heap a 100,000-rule file holds parsed and
// then built, and holds both to few objects: the collector marks each live
// object on every cycle, and built object by object this config was
// 740,000 of them, its parsed file 400,000 more while it loaded (see
// pack.go).
func TestScaleMemory(t *testing.T) {
	data := scaleConfig(80_000, 20_000)
	var before, parsed, built runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f, err := Parse("scale.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&parsed)
	c, err := Build([]*File{f}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	f = nil // the config alone from here
	runtime.GC()
	runtime.ReadMemStats(&built)
	for _, m := range []struct {
		what  string
		after *runtime.MemStats
	}{{"parsed", &parsed}, {"built", &built}} {
		bytes, objects := m.after.HeapAlloc-before.HeapAlloc, m.after.HeapObjects-before.HeapObjects
		t.Logf("100,000 rules %s hold %d bytes of heap, %d per rule, in %d objects", m.what, bytes, bytes/100_000, objects)
		if objects > 50_000 {
			t.Errorf("100,000 rules %s hold %d heap objects, want at most 50,000 (one every two rules)", m.what, objects)
		}
	}
	runtime.KeepAlive(f)
	runtime.KeepAlive(c)
}

// BenchmarkVersionScale is what naming a 100,000-rule config costs on each
// load (the reload log line and /rlconfig name it).
func BenchmarkVersionScale(b *testing.B) {
	f, err := Parse("scale.yaml", scaleConfig(80_000, 20_000))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		b.StopTimer()
		c, err := Build([]*File{f}, Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		_ = c.Version()
	}
}

// BenchmarkCollectScale is one full collection with a 100,000-rule config
// live: what the collector spends on the config each cycle the service
// runs (the service's own garbage aside).
func BenchmarkCollectScale(b *testing.B) {
	c := buildScale(b, 80_000, 20_000)
	runtime.GC()
	for b.Loop() {
		runtime.GC()
	}
	runtime.KeepAlive(c)
}
