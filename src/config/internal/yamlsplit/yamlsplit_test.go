package yamlsplit

import (
	"reflect"
	"strings"
	"testing"
)

func TestIndex(t *testing.T) {
	for _, tc := range []struct {
		data string
		want []string
	}{
		{"", nil},
		{"a\n", []string{"a\n"}},
		{"a\nb", []string{"a\n", "b"}},
		{"a\n\nb\n", []string{"a\n", "\n", "b\n"}},
	} {
		ls := Index([]byte(tc.data))
		var got []string
		for i := range ls.N() {
			got = append(got, string(ls.Line(i)))
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Index(%q): lines %q, want %q", tc.data, got, tc.want)
		}
		if span := string(ls.Span(0, ls.N())); span != tc.data {
			t.Errorf("Index(%q): Span over every line is %q", tc.data, span)
		}
	}
}

func TestPlain(t *testing.T) {
	for _, tc := range []struct {
		data string
		want bool
	}{
		{"domain: d\ndescriptors:\n  - key: a\n", true},
		{"descriptors:\n  - {key: a, value: \"x & *y\"}\n", true}, // indicators inside quotes
		{"descriptors:\n  - key: user's\n", true},                 // an apostrophe in a plain scalar
		{"descriptors:\n  - key: a # &not an anchor\n", true},     // in a comment
		{"descriptors:\n  - key: a&b\n", true},                    // inside a plain scalar
		{"descriptors:\n  - key: &a x\n", false},                  // anchor
		{"descriptors:\n  - key: *a\n", false},                    // alias
		{"descriptors:\n  - key: !!str a\n", false},               // tag
		{"%YAML 1.2\n---\ndomain: d\n", false},                    // directive
		{"domain: d\n---\ndomain: e\n", false},                    // document marker
		{"domain: d\n...\n", false},                               // document end
		{"descriptors:\n  - key: |\n      text\n", false},         // block scalar
		{"descriptors:\n\t- key: a\n", false},                     // tab
		{"domain: d\r\n", false},                                  // CR
		{"# x\u0085domain: d\n", false},                           // NEL
		{"# x\u2028domain: d\n", false},                           // LS
		{"# x\u2029domain: d\n", false},                           // PS
		{"descriptors:\n  - key: 'open\n", false},                 // an unterminated quote
		{"descriptors:\n  - key: \"a\\\"b\"\n", true},             // an escaped quote
	} {
		if got := Plain([]byte(tc.data)); got != tc.want {
			t.Errorf("Plain(%q) = %v, want %v", tc.data, got, tc.want)
		}
	}
}

func TestItems(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       []Item
		ok         bool
	}{
		{"indented items", "domain: d\ndescriptors:\n  - key: a\n    value: x\n  - key: b\n", []Item{{2, 4}, {4, 5}}, true},
		{"items at the key's column, a key after",
			"descriptors:\n- key: a\n- key: b\ndomain: d\n", []Item{{1, 2}, {2, 3}}, true},
		{"blank and comment lines end an item before them",
			"descriptors:\n  - key: a\n\n  # c\n  - key: b\n", []Item{{1, 2}, {4, 5}}, true},
		{"an empty item", "descriptors:\n  -\n  - key: b\n", []Item{{1, 2}, {2, 3}}, true},
		{"a comment after the key", "descriptors: # the list\n  - key: a\n", []Item{{1, 2}}, true},
		{"no descriptors", "domain: d\n", nil, false},
		{"a flow list", "descriptors: [{key: a}]\n", nil, false},
		{"the top level indented", "  domain: d\ndescriptors:\n  - key: a\n", nil, false},
		{"items at two columns", "descriptors:\n    - key: a\n  - key: b\n", nil, false},
		{"a continuation at the left edge", "descriptors:\n  - key: a\nb\n", nil, false},
		{"no space after the colon", "descriptors:\n  - key: a\nb:c\n", nil, false},
	} {
		got, ok := Items(Index([]byte(tc.data)))
		if ok != tc.ok || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: Items = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// TestCovered checks Covered against a plain scan over every line.
func TestCovered(t *testing.T) {
	items := []Item{{2, 4}, {4, 5}, {7, 10}}
	for i := range 12 {
		want := false
		for _, it := range items {
			want = want || it.Start <= i && i < it.End
		}
		if got := Covered(items, i); got != want {
			t.Errorf("Covered(%v, %d) = %v, want %v", items, i, got, want)
		}
	}
	if Covered(nil, 0) {
		t.Error("Covered(nil, 0) = true")
	}
}

// TestItemsSpanTheList: the items' spans, with what lies between them, are
// the list's lines exactly, so each piece decodes on its own.
func TestItemsSpanTheList(t *testing.T) {
	data := "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n\n  - key: b\n    descriptors:\n      - key: c\n# end\n"
	ls := Index([]byte(data))
	items, ok := Items(ls)
	if !ok || len(items) != 2 {
		t.Fatalf("Items = %v, %v", items, ok)
	}
	got := string(ls.Span(items[0].Start, items[1].End))
	want := "  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n\n  - key: b\n    descriptors:\n      - key: c\n"
	if got != want {
		t.Errorf("the list's lines:\n%q\nwant\n%q", got, want)
	}
	if !strings.HasPrefix(string(ls.Span(items[1].Start, items[1].End)), "  - key: b") {
		t.Errorf("the second item starts %q", ls.Span(items[1].Start, items[1].End))
	}
}
