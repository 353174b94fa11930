package config

import (
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
