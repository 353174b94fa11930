package config

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestDecodeMetadataAsYAMLDecodes: metadata decoded by decodeMetadata is
// what yaml.v3's Decode makes of it, for the shapes metadata takes:
// nesting, sequences, every scalar type, anchors and aliases, non-string
// keys, merge keys; and a duplicate key is refused as Decode refuses it.
func TestDecodeMetadataAsYAMLDecodes(t *testing.T) {
	docs := []string{
		"a: 1\nb: 2.5\nc: true\nd: null\ne: text\nf: \"quoted\"\ng: 0x10\nh: ~\n",
		"nested: {x: {y: [1, two, {z: 3}]}}\nlist: [a, [b, c]]\n",
		"base: &b {k: v, n: 1}\nuse: *b\nseq: &s [1, 2]\nagain: *s\n",
		"1: one\ntrue: yes-key\nnull: nothing\n",
		"base: &b {k: v}\nmerged: {<<: *b, extra: 1}\n",
		"time: 2001-12-14t21:59:43.10-05:00\nbin: !!binary aGVsbG8=\n",
		"empty: {}\nemptylist: []\n",
	}
	for _, doc := range docs {
		var n yaml.Node
		if err := yaml.Unmarshal([]byte(doc), &n); err != nil {
			t.Fatal(err)
		}
		m := n.Content[0]
		var want any
		wantErr := m.Decode(&want)
		got, err := decodeMetadata(m)
		if (err == nil) != (wantErr == nil) || !reflect.DeepEqual(got, want) {
			t.Errorf("%q:\n got %#v, %v\nwant %#v, %v", doc, got, err, want, wantErr)
		}
	}
	var n yaml.Node
	if err := yaml.Unmarshal([]byte("a: 1\nb: 2\na: 3\n"), &n); err != nil {
		t.Fatal(err)
	}
	if _, err := decodeMetadata(n.Content[0]); err == nil || !strings.Contains(err.Error(), `line 3: mapping key "a" already defined at line 1`) {
		t.Errorf("duplicate key: error %v", err)
	}
}

// TestLargeMetadataMapping: 100,000 keys under one metadata mapping load
// (yaml.v3's own decoding checks duplicates pairwise: over a minute here),
// every key kept, and a duplicate among them is still refused with its
// line.
func TestLargeMetadataMapping(t *testing.T) {
	const keys = 100_000
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n    metadata:\n")
	for i := range keys {
		fmt.Fprintf(&b, "      k%d: v%d\n", i, i)
	}
	f, err := Parse("big.yaml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if md := f.Descriptors[0].Metadata; len(md) != keys || md["k99999"] != "v99999" {
		t.Errorf("metadata has %d keys (k99999 = %v), want %d", len(md), md["k99999"], keys)
	}
	b.WriteString("      k5: again\n")
	if _, err := Parse("big.yaml", []byte(b.String())); err == nil || !strings.Contains(err.Error(), `mapping key "k5" already defined at line 11`) {
		t.Errorf("a duplicate among 100,000 keys: error %v", err)
	}
}
