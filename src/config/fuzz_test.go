package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// FuzzParse: malformed YAML never panics, and every error is positioned.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"domain: [\n", "- a\n- b\n", "domain: d\ndescriptors:\n  - key: &a x\n    value: *a\n", "",
		"domain: d\ndescriptors:\n  - key: a\n    rate_limits: [{unit: hour, requests_per_unit: 9, algorithm: token_bucket, burst: 3}]\n",
		// Anchors and aliases: shared limits, a nested fan-out, a cycle,
		// a merge key, an alias to a scalar used as a mapping.
		"domain: d\ndescriptors:\n- {key: a, rate_limit: &l {unit: hour, requests_per_unit: 2}}\n- {key: b, rate_limit: *l}\n",
		"domain: d\ndescriptors:\n- &a {key: a}\n- &b {key: b, descriptors: [*a,*a,*a]}\n- {key: c, descriptors: [*b,*b,*b]}\n",
		"domain: d\ndescriptors: &x\n- {key: a, descriptors: *x}\n",
		"domain: d\ndescriptors:\n- &a {key: a}\n- {<<: *a, value: v}\n",
		"domain: &s d\ndescriptors:\n- *s\n- {key: *s, metadata: {m: &m [1, 2], n: *m}}\n",
		// Calendars and slots: a zone, a name that is none, a path.
		"domain: d\ndescriptors:\n- {key: a, rate_limit: {unit: month, requests_per_unit: 9, calendar: America/New_York}}\n",
		"domain: d\ndescriptors:\n- {key: a, rate_limit: {unit: day, requests_per_unit: 9, calendar: ../../etc/passwd, algorithm: sliding_window}}\n",
		"domain: d\ndescriptors:\n- {key: a, rate_limit: {unit: minute, requests_per_unit: 3, algorithm: concurrency}}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse("f.yaml", data)
		if file != nil {
			// Aliases cannot make a small file describe a large tree.
			if n, bound := countDescriptors(file.Descriptors), max(aliasExpansion*len(data), aliasFloor); n > bound {
				t.Fatalf("%d bytes parsed into %d descriptors, over the bound %d", len(data), n, bound)
			}
		}
		if err == nil {
			_, err = Build([]*File{file}, Options{})
		}
		if err == nil {
			return
		}
		var ce *Error
		if !errors.As(err, &ce) || ce.File != "f.yaml" {
			t.Fatalf("Parse error %q is not a positioned *config.Error", err)
		}
	})
}

func countDescriptors(ds []*Descriptor) int {
	n := len(ds)
	for _, d := range ds {
		n += countDescriptors(d.Descriptors)
	}
	return n
}

// decodeFields splits an encoded key back into its fields; it is the proof
// that the encoding is injective (a decoder exists).
func decodeFields(t *testing.T, key string) (fields []string, tail string) {
	t.Helper()
	if !strings.HasPrefix(key, "{") {
		t.Fatalf("key %q does not start with {", key)
	}
	s := key[1:]
	for !strings.HasPrefix(s, "}:") {
		i := strings.IndexAny(s, ":#*%")
		if i <= 0 {
			t.Fatalf("key %q: bad field at %q", key, s)
		}
		n, err := strconv.Atoi(s[:i])
		if err != nil {
			t.Fatalf("key %q: bad length %q", key, s[:i])
		}
		tag := s[i]
		s = s[i+1:]
		width := n
		if tag == '#' || tag == '%' {
			width = 32
		}
		if len(s) < width {
			t.Fatalf("key %q: field shorter than its length", key)
		}
		fields = append(fields, string(tag)+s[:width])
		s = s[width:]
	}
	return fields, s[2:]
}

func FuzzKey(f *testing.F) {
	f.Add("dom", "a_b\x00c")
	f.Add("dom", "a\x00b_c")
	f.Add("d}", "{}\x00:1")
	f.Add("x", strings.Repeat("z", 200)+"\x00v")
	f.Fuzz(func(t *testing.T, domain, kvs string) {
		parts := strings.Split(kvs, "\x00")
		if len(parts)%2 == 1 {
			parts = append(parts, "")
		}
		b := appendKeyStart(nil, domain)
		for i := 0; i < len(parts); i += 2 {
			b = appendKeyEntry(b, nil, parts[i], parts[i+1], false)
		}
		b = appendKeyEnd(b)
		b = append(b, "fw60"...)
		fields, tail := decodeFields(t, string(b))
		want := append([]string{domain}, parts...)
		if len(fields) != len(want) || tail != "fw60" {
			t.Fatalf("key %q decodes to %d fields + %q, want %d + fw60", b, len(fields), tail, len(want))
		}
		for i, w := range want {
			exp := ":" + w
			if len(w) > maxRawField {
				sum := sha256.Sum256([]byte(w))
				exp = "#" + hex.EncodeToString(sum[:16])
			}
			if fields[i] != exp {
				t.Fatalf("key %q field %d = %q, want %q", b, i, fields[i], exp)
			}
		}
	})
}

// FuzzMatch: any request descriptor, however odd, matches or not without
// panicking, and every key it yields decodes back to its fields.
func FuzzMatch(f *testing.F) {
	f.Add("remote_address", "10.0.0.1", "", "", uint32(1))
	f.Add("path", "/api/v2/x", "", "", uint32(0))
	f.Add("message_type", "marketing", "to_number", "\x00\xff}{", uint32(3))
	f.Add("tenant", "free-*", "", "", uint32(7))
	c, err := LoadFiles([]string{"testdata/good/example.yaml"}, Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string, addend uint32) {
		d := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: k1, Value: v1}}}
		if k2 != "" {
			d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k2, Value: v2})
		}
		p, err := c.Plan("shop", []*rlv3.RateLimitDescriptor{d}, addend)
		if err != nil {
			t.Fatalf("Plan() error without an override: %v", err)
		}
		for _, h := range p.Hits {
			fields, _ := decodeFields(t, h.Key)
			if len(fields) != 1+2*len(d.Entries) {
				t.Fatalf("key %q has %d fields for %d entries", h.Key, len(fields), len(d.Entries))
			}
		}
	})
}

// FuzzChunks: whenever a file is taken in pieces, the pieces decode to
// what the whole document does, errors included.
func FuzzChunks(f *testing.F) {
	for _, s := range []string{
		"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n  - key: a\n",
		"descriptors:\n- {key: a, value: \"x'y\"}\n- key: b\n  descriptors:\n  - key: c\ndomain: d\n",
		"domain: d\ndescriptors:\n  - key: a\n    value: 'q\n      r'\n  - key: b\n",
		// Line breaks the parser honours besides LF, and document markers.
		"# c\u0085---\ndomain: d\ndescriptors:\n  - key: a\n# x\u2028  - key: b\n",
		"domain: d\ndescriptors:\n  - key: a\n# x\u2029descriptors: []\r\n  - key: b\n...\n]\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sameParse(t, string(data))
	})
}
