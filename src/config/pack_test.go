package config

import (
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
		ls := p.copyLimits([]*Limit{{RequestsPerUnit: uint32(i), identity: "fw" + s}, {RequestsPerUnit: uint32(i + 1)}})
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

// TestBuildLeavesFileAlone: a config holds copies of the parsed file's
// limits, so building twice from one file gives two configs that agree,
// and the file is as parsed.
func TestBuildLeavesFileAlone(t *testing.T) {
	f, err := Parse("f.yaml", []byte(`domain: d
descriptors:
  - key: k
    value: v
    rate_limit: {unit: second, requests_per_unit: 5, lease: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	parsed := *f.Descriptors[0].Limits[0]
	var got []*Limit
	for range 2 {
		c, err := Build([]*File{f}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		n := c.Domain("d").Match(desc("k=v").GetEntries())
		if n == nil || len(n.limits) != 1 {
			t.Fatalf("k=v matched %v", n)
		}
		got = append(got, n.limits[0])
	}
	if got[0] == got[1] || got[0].Rule.Lease != "d.k_v" || got[1].Rule.Lease != "d.k_v" || got[0].MetricKey != "k_v" {
		t.Errorf("limits of two builds: %+v and %+v", got[0], got[1])
	}
	if l := f.Descriptors[0].Limits[0]; l.MetricKey != parsed.MetricKey || l.Rule != parsed.Rule {
		t.Errorf("Build changed the parsed limit: %+v, was %+v", l, parsed)
	}
}
