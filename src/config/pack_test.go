package config

import (
	"github.com/openrls/ratelimit/src/config/configtest"
	"slices"
	"strings"
	"testing"
)

func TestPackerSplit(t *testing.T) {
	var p packer
	for _, s := range []string{"*", "a*", "*a", "a*b", "**", "a**b*", "org-*-user-*", strings.Repeat("x*", 600)} {
		got, want := p.split(p.str(s)), strings.Split(s, "*")
		if !slices.Equal(got, want) {
			t.Errorf("split(%q) = %q, want %q", s, got, want)
		}
		if cap(got) != len(got) {
			t.Errorf("split(%q): capacity %d past its %d parts: an append would write over the next node's", s, cap(got), len(got))
		}
	}
}

// TestPackerKeepsWhatItGave: strings, nodes and limits handed out earlier
// keep their contents however many come after them (blocks are replaced
// when full, never written again).
func TestPackerKeepsWhatItGave(t *testing.T) {
	var p packer
	type given struct {
		s      string
		n      *Node
		limits []*Limit
	}
	var all []given
	for i := range 5000 {
		s := strings.Repeat(string(rune('a'+i%26)), i%300)
		n := p.node()
		n.line = i
		a, b := p.limit(), p.limit()
		*a, *b = Limit{RequestsPerUnit: uint32(i), identity: p.str("fw" + s)}, Limit{RequestsPerUnit: uint32(i + 1)}
		ls := p.limitList([]*Limit{a, b})
		all = append(all, given{p.str(s), n, ls})
	}
	for i, g := range all {
		want := strings.Repeat(string(rune('a'+i%26)), i%300)
		if g.s != want || g.n.line != i || len(g.limits) != 2 || cap(g.limits) != 2 ||
			g.limits[0].RequestsPerUnit != uint32(i) || g.limits[0].identity != "fw"+want || g.limits[1].RequestsPerUnit != uint32(i+1) {
			t.Fatalf("item %d changed: %q line %d limits %+v", i, g.s, g.n.line, g.limits)
		}
	}
	if p.key("tenant") != p.key(strings.Clone("tenant")) {
		t.Error("a key is not interned")
	}
}

// TestBuildTwice: a config keeps its file's limits, and building the same
// file again sets the same names on them, so the first config still reads
// what it did.
func TestBuildTwice(t *testing.T) {
	f, err := Parse("f.yaml", []byte(`domain: d
descriptors:
  - key: k
    value: v
    rate_limits:
      - {unit: second, requests_per_unit: 5, lease: true}
      - {unit: hour, requests_per_unit: 100}
`))
	if err != nil {
		t.Fatal(err)
	}
	var names [][]string
	for range 2 {
		c, err := Build([]*File{f}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		n := c.Domain("d").Match(configtest.Desc("k=v").GetEntries())
		if n == nil || len(n.limits) != 2 {
			t.Fatalf("k=v matched %v", n)
		}
		names = append(names, []string{n.limits[0].MetricKey, n.limits[0].Rule.Lease, n.limits[1].MetricKey, n.limits[1].Rule.Lease})
	}
	want := []string{"k_v.fw1", "d.k_v.fw1", "k_v.fw3600", ""}
	for i, got := range names {
		if !slices.Equal(got, want) {
			t.Errorf("build %d names its limits %q, want %q", i+1, got, want)
		}
	}
}
