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
