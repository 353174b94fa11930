package config

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// sameParse parses data whole and in pieces of two items and requires the
// same result, errors included, when the pieces are taken; it returns
// whether they were.
func sameParse(t *testing.T, data string) bool {
	t.Helper()
	want, wantErr := parseWhole("f.yaml", []byte(data))
	got, ok, gotErr := parseInChunks("f.yaml", []byte(data), 0, 2)
	if !ok {
		return false
	}
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		t.Fatalf("errors differ for\n%s\nin pieces: %v\nwhole:     %v", data, gotErr, wantErr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("files differ for\n%s\nin pieces: %s\nwhole:     %s", data, dumpFile(got), dumpFile(want))
	}
	return true
}

func dumpFile(f *File) string {
	if f == nil {
		return "<nil>"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s@%d:", f.Domain, f.Line)
	var walk func(ds []*Descriptor)
	walk = func(ds []*Descriptor) {
		for _, d := range ds {
			fmt.Fprintf(&b, " [%s %s=%s", d.Path, d.Key, d.Value)
			for _, l := range d.Limits {
				fmt.Fprintf(&b, " %s@%d", l, l.Line)
			}
			walk(d.Descriptors)
			b.WriteString("]")
		}
	}
	walk(f.Descriptors)
	return b.String()
}

// TestChunksMatchWhole: what the pieces decode is what the whole document
// decodes, on the shapes configs are written in, errors and all; and the
// shapes a line-based split could misread are left to the whole decode.
func TestChunksMatchWhole(t *testing.T) {
	taken := []string{
		// Block style, nested, comments and blank lines between items.
		"domain: d\ndescriptors:\n  - key: a\n    value: x\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n\n  # a comment\n  - key: b\n    descriptors:\n      - key: c\n        rate_limit: {unit: hour, requests_per_unit: 9}\n  - key: e\n    rate_limits:\n      - {unit: minute, requests_per_unit: 1}\n      - {unit: hour, requests_per_unit: 10, algorithm: sliding_window, lease: true}\n",
		// Flow style items, items at the key's indentation, domain last.
		"descriptors:\n- {key: user, value: tenant-1, rate_limit: {unit: minute, requests_per_unit: 101}}\n- {key: user, value: org-1-*, rate_limit: {unit: minute, requests_per_unit: 50}}\n- {key: user,\n   rate_limit: {unit: minute, requests_per_unit: 10}}\ndomain: late\n",
		// Errors in several pieces, a duplicate across pieces, metadata,
		// quoted values with apostrophes and colons.
		"domain: d\ndescriptors:\n  - key: a\n    value: \"it's: here\"\n    rate_limit: {unit: eon, requests_per_unit: 1}\n  - key: b\n    metadata: {team: 'o''brien', n: 3}\n  - key: a\n    value: \"it's: here\"\n  - value: no key\n  - key: c\n    colour: red\n",
		// Top-level errors beside the list: an unknown key, no domain.
		"descriptors:\n  - key: a\n  - key: b\nextra: 1\n",
		// Items of the list that are not mappings; a trailing comment.
		"domain: d\ndescriptors:\n  - just text\n  - [a, b]\n  - key: ok\n# the end\n",
		// A plain scalar with an apostrophe.
		"domain: d\ndescriptors:\n  - key: user's\n    value: o'neil\n",
		// Double-quoted strings holding escapes and YAML indicators, as the
		// xDS source writes them.
		"domain: \"d\"\ndescriptors:\n  - key: \"a\\\"b & *c\"\n    value: \"#d\\n- e\"\n    rate_limit: {unit: \"minute\", requests_per_unit: 1, name: \"x\\\\\"}\n  - key: \"f\"\n",
	}
	for i, data := range taken {
		if !sameParse(t, data) {
			t.Errorf("case %d was not taken in pieces:\n%s", i, data)
		}
	}
	declined := []string{
		"domain: d\ndescriptors:\n- {key: a, rate_limit: &l {unit: hour, requests_per_unit: 2}}\n- {key: b, rate_limit: *l}\n",
		"domain: d\ndescriptors: [{key: a}, {key: b}]\n",
		"domain: d\ndescriptors:\n  - key: a\n    metadata: {note: |\n      text}\n",
		"domain: d\ndescriptors:\n  - key: a\n---\ndomain: e\n",
		"domain: d\ndescriptors:\n\t- key: a\n",
		"domain: d\ndescriptors:\n  - key: !!str a\n",
		"domain: d\ndescriptors:\n    - key: a\n  - key: b\n",
		"domain: d\ndescriptors:\n  - key: a\n    value: 'unterminated\n  - key: b\n",
		// Line breaks the YAML parser honours and a split at "\n" would
		// not: CR, NEL, LS and PS, here inside comments.
		"domain: d\ndescriptors:\n  - key: a\n# x\r  - key: b\n",
		"domain: d\ndescriptors:\n  - key: a\n# x\u0085  - key: b\n",
		"domain: d\ndescriptors:\n  - key: a\n# x\u2028  - key: b\n",
		"domain: d\ndescriptors:\n  - key: a\n# x\u2029  - key: b\n",
		"# x\u0085---\ndomain: d\ndescriptors:\n  - key: a\n",
	}
	for i, data := range declined {
		if _, taken, _ := parseInChunks("f.yaml", []byte(data), 0, 2); taken {
			t.Errorf("case %d was taken in pieces, want it left to the whole decode:\n%s", i, data)
		}
	}
}

// TestLargeFileInPieces: a 100,000-rule file goes through Parse in pieces,
// and gives what the whole decode gives.
func TestLargeFileInPieces(t *testing.T) {
	data := scaleConfig(8_000, 2_000)
	got, ok, err := parseInChunks("scale.yaml", data, chunkMin, chunkItems)
	if !ok || err != nil {
		t.Fatalf("not parsed in pieces: ok %v, %v", ok, err)
	}
	want, err := parseWhole("scale.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Error("pieces and whole differ")
	}
}

// TestOneMeaningPerFile: a file means the same whatever its size, small
// (decoded whole) or large (decoded in pieces when its shape allows):
// a line break the parser honours inside a comment breaks the line at both
// sizes, and anything after the first document but comments and blank
// lines is an error with its line at both sizes.
func TestOneMeaningPerFile(t *testing.T) {
	build := func(rules int, tail string) []byte {
		var b strings.Builder
		b.WriteString("domain: d\ndescriptors:\n")
		for i := range rules {
			fmt.Fprintf(&b, "  - key: k%d\n    rate_limit: {unit: second, requests_per_unit: 1}\n", i)
		}
		b.WriteString(tail)
		return []byte(b.String())
	}
	small, large := 10, 6_000 // under and over chunkMin
	if n := len(build(large, "")); n < chunkMin {
		t.Fatalf("the large file is %d bytes, under chunkMin %d", n, chunkMin)
	}
	for _, brk := range []string{"\u0085", "\u2028", "\u2029"} {
		for _, rules := range []int{small, large} {
			data := build(rules, "# the end"+brk+"  - key: hidden\n")
			f, err := Parse("f.yaml", data)
			if err != nil {
				t.Fatalf("break %q, %d rules: %v", brk, rules, err)
			}
			if n, last := len(f.Descriptors), f.Descriptors[len(f.Descriptors)-1].Key; n != rules+1 || last != "hidden" {
				t.Errorf("break %q in a comment, %d rules: %d descriptors, the last %q; want %d, the last \"hidden\"", brk, rules, n, last, rules+1)
			}
		}
	}
	// At the top, the break makes a second domain: an error at both sizes.
	for _, brk := range []string{"\u0085", "\u2028"} {
		for _, rules := range []int{small, large} {
			_, err := Parse("f.yaml", append([]byte("# c"+brk+"domain: e\n"), build(rules, "")...))
			if err == nil || !strings.Contains(err.Error(), `field "domain" given twice`) {
				t.Errorf("break %q in a comment above the domain, %d rules: error %v, want the domain given twice", brk, rules, err)
			}
		}
	}
	for _, tc := range []struct {
		tail, want string
		after      int // the error's line, counted from the marker's
	}{
		{"...\n]\n", "f.yaml:%d: invalid YAML:", 1},
	} {
		for _, rules := range []int{small, large} {
			data := build(rules, tc.tail)
			line := 2*rules + 3 + tc.after
			_, err := Parse("f.yaml", data)
			if want := fmt.Sprintf(tc.want, line); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%q after the document, %d rules: error %v, want %q", tc.tail, rules, err, want)
			}
		}
	}
	// A second document is not read, and Ignored says so, at both sizes.
	for _, rules := range []int{small, large} {
		f, err := Parse("f.yaml", build(rules, "---\ndomain: e\n"))
		if want := fmt.Sprintf("from line %d on are not read", 2*rules+3); err != nil || !strings.Contains(f.Ignored, want) || f.Domain == "e" {
			t.Errorf("a second document after the first, %d rules: %v, ignored %q: want the first read and %q", rules, err, f.Ignored, want)
		}
	}
	for _, rules := range []int{small, large} {
		if _, err := Parse("f.yaml", build(rules, "...\n# only comments\n\n")); err != nil {
			t.Errorf("comments after the end marker, %d rules: %v", rules, err)
		}
	}
}
