package config

import (
	"runtime"
	"strings"
	"testing"
)

func TestUnreachable(t *testing.T) {
	long := strings.Repeat("x", 20)
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"all reachable", "domain: d\ndescriptors:\n  - key: a\n    value: '*" + long[:10] + "'\n    descriptors:\n      - key: b\n", nil},
		{"long domain", "domain: " + long + "\ndescriptors:\n  - key: a\n", []string{"f.yaml:1: domain: never matches: the domain is 20 bytes"}},
		{"long key", "domain: d\ndescriptors:\n  - key: " + long + "\n", []string{"f.yaml:3: descriptors[0]: never matches: the key is 20 bytes and requests carry at most 16"}},
		{"long value", "domain: d\ndescriptors:\n  - key: a\n    value: " + long + long + "\n", []string{"f.yaml:3: descriptors[0]: never matches: the value is 40 bytes and a whole request is at most 32"}},
		{"wildcards do not count", "domain: d\ndescriptors:\n  - key: a\n    value: '" + strings.Repeat("*", 40) + "'\n", nil},
		{"too deep, reported once", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        descriptors:\n          - key: c\n            descriptors:\n              - key: e\n",
			[]string{"f.yaml:7: descriptors[0].descriptors[0].descriptors[0]: never matches: it is 3 levels deep and requests carry at most 2 entries"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Unreachable([]*File{mustParse(t, "f.yaml", tc.yaml)}, RequestBounds{MaxStringBytes: 16, MaxEntries: 2, MaxRequestBytes: 32})
			if len(got) != len(tc.want) {
				t.Fatalf("Unreachable() = %v, want %d warnings %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(got[i].Error(), w) {
					t.Errorf("warning %d = %q, want prefix %q", i, got[i], w)
				}
			}
		})
	}
}

// TestDepthIsBounded: a descriptor deeper than any request can reach is a
// config error with file and line (Options.MaxDepth, REQUEST_MAX_ENTRIES),
// and a file nested past MaxDepth is refused while parsing, cheaply: the
// 2,000-level file with 1,000-byte keys (2 MB) that once took gigabytes to
// build is refused within a bounded allocation.
func TestDepthIsBounded(t *testing.T) {
	three := "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        descriptors:\n          - key: c\n"
	_, err := Build([]*File{mustParse(t, "f.yaml", three)}, Options{MaxDepth: 2})
	if err == nil || !strings.Contains(err.Error(), "f.yaml:7: descriptors[0].descriptors[0].descriptors[0]: nested 3 levels deep, but requests carry at most 2 entries") {
		t.Errorf("Build(3 levels, MaxDepth 2) = %v", err)
	}
	if _, err := Build([]*File{mustParse(t, "f.yaml", three)}, Options{MaxDepth: 3}); err != nil {
		t.Errorf("Build(3 levels, MaxDepth 3) = %v", err)
	}

	var b strings.Builder
	b.WriteString("domain: deep\ndescriptors:\n")
	key := strings.Repeat("k", 1000)
	for i := range 2000 {
		indent := strings.Repeat(" ", 2*i)
		b.WriteString(indent + "- key: " + key + "\n" + indent + "  descriptors:\n")
	}
	b.WriteString(strings.Repeat(" ", 4000) + "- key: leaf\n")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = Parse("deep.yaml", []byte(b.String()))
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "nested more than 1024 levels deep") {
		t.Fatalf("Parse(2,000 levels) = %v, want refused", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 512<<20 {
		t.Errorf("refusing a 2,000-level file allocated %d MB, want it bounded (< 512 MB)", alloc>>20)
	} else {
		t.Logf("refusing a %d KB 2,000-level file allocated %d MB", b.Len()>>10, alloc>>20)
	}
}

func TestUnknownReplaces(t *testing.T) {
	a := mustParse(t, "a.yaml", `domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5, name: base}
  - key: vip
    rate_limit:
      unit: minute
      requests_per_unit: 50
      replaces:
        - name: base
        - name: bsae
`)
	b := mustParse(t, "b.yaml", `domain: d
descriptors:
  - key: other
    rate_limit: {unit: hour, requests_per_unit: 1, replaces: [{name: base}]}
`)
	// The warning names the line of the entry that names it.
	got := UnknownReplaces([]*File{a, b})
	if len(got) != 1 || !strings.HasPrefix(got[0].Error(), `a.yaml:11: descriptors[1]: replaces "bsae", but no limit of domain "d" is named so`) {
		t.Errorf("UnknownReplaces() = %v, want one warning for the typo only", got)
	}
}
