package arena

import (
	"strings"
	"testing"
)

// TestKeepsWhatItGave: strings, items and copies handed out earlier keep
// their contents however many come after them.
func TestKeepsWhatItGave(t *testing.T) {
	var text Text
	var ints Slab[int]
	var lists Slab[string]
	type given struct {
		s    string
		n    *int
		list []string
	}
	var all []given
	for i := range 5000 {
		s := strings.Repeat(string(rune('a'+i%26)), i%300)
		n := ints.New()
		*n = i
		all = append(all, given{text.String(s), n, lists.Copy(s, "x")})
	}
	for i, g := range all {
		want := strings.Repeat(string(rune('a'+i%26)), i%300)
		if g.s != want || *g.n != i || len(g.list) != 2 || g.list[0] != want || g.list[1] != "x" {
			t.Fatalf("item %d changed: %q %d %q", i, g.s, *g.n, g.list)
		}
		if cap(g.list) != len(g.list) {
			t.Fatalf("copy %d has capacity %d past its %d items: an append would write over the next", i, cap(g.list), len(g.list))
		}
	}
}

// TestBlocks: blocks grow to their bounds, the first sized by First, and a
// copy larger than a block gets one of its own.
func TestBlocks(t *testing.T) {
	var s Slab[int]
	for range 5000 {
		s.New()
	}
	if got := cap(s.block); got != MaxItems {
		t.Errorf("block of %d items after 5000, want %d", got, MaxItems)
	}
	first := Slab[int]{First: 200}
	first.New()
	if got := cap(first.block); got != 200 {
		t.Errorf("first block of %d items, want First's 200", got)
	}
	big := make([]int, 3*MaxItems)
	if got := first.Copy(big...); len(got) != 3*MaxItems {
		t.Errorf("a copy of %d items is %d long", len(big), len(got))
	}
	if got := first.Copy(); got != nil {
		t.Errorf("a copy of nothing = %v, want nil", got)
	}
	var text Text
	if got := text.String(strings.Repeat("x", 2*MaxText)); len(got) != 2*MaxText {
		t.Errorf("a string past a block is %d bytes", len(got))
	}
	if text.String("") != "" || cap(text.block) != 2*MaxText {
		t.Error("the empty string took room")
	}
}
