package config

import (
	"strings"
	"testing"
)

// TestYAML11Booleans: the words YAML 1.1 reads as booleans (yes, on, y,
// off, ...), which envoyproxy/ratelimit's configs use, mean the same here
// when plain; quoted or tagged they stay text, as there.
func TestYAML11Booleans(t *testing.T) {
	tests := []struct {
		word    string
		want    bool
		wantErr bool
	}{
		{"yes", true, false}, {"Yes", true, false}, {"YES", true, false}, {"y", true, false}, {"Y", true, false},
		{"on", true, false}, {"On", true, false}, {"ON", true, false}, {"true", true, false}, {"True", true, false},
		{"no", false, false}, {"No", false, false}, {"n", false, false}, {"off", false, false}, {"OFF", false, false},
		{"false", false, false},
		{`"yes"`, false, true}, {`'on'`, false, true}, {"!!str yes", false, true}, {"yess", false, true}, {"1", false, true},
	}
	for _, tt := range tests {
		src := "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: " + tt.word + "\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
		f, err := Parse("b.yaml", []byte(src))
		if tt.wantErr {
			if err == nil || !strings.Contains(err.Error(), "want true or false") {
				t.Errorf("shadow_mode: %s: error = %v, want a want-true-or-false error", tt.word, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("shadow_mode: %s: %v", tt.word, err)
			continue
		}
		if got := f.Descriptors[0].ShadowMode; got != tt.want {
			t.Errorf("shadow_mode: %s = %v, want %v", tt.word, got, tt.want)
		}
	}
	f := mustParse(t, "u.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: yes}\n    detailed_metric: on\n")
	if d := f.Descriptors[0]; !d.Limits[0].Unlimited || !d.DetailedMetric {
		t.Errorf("unlimited: yes, detailed_metric: on = %v, %v, want both true", d.Limits[0].Unlimited, d.DetailedMetric)
	}
}

// TestYAML11MetadataValues: metadata values read as the reference reads
// them: plain yes/off are booleans, quoted ones and keys stay text.
func TestYAML11MetadataValues(t *testing.T) {
	f := mustParse(t, "m.yaml", `domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata:
      enabled: yes
      legacy: off
      quoted: "yes"
      yes: plain-key
      nested: {list: [on, "on", n]}
`)
	md := f.Descriptors[0].Metadata
	nested := md["nested"].(map[string]any)["list"].([]any)
	for name, got := range map[string]any{"enabled": md["enabled"], "legacy": md["legacy"], "quoted": md["quoted"],
		"yes (a key)": md["yes"], "list[0]": nested[0], "list[1]": nested[1], "list[2]": nested[2]} {
		want := map[string]any{"enabled": true, "legacy": false, "quoted": "yes", "yes (a key)": "plain-key",
			"list[0]": true, "list[1]": "on", "list[2]": false}[name]
		if got != want {
			t.Errorf("metadata %s = %#v, want %#v", name, got, want)
		}
	}
}
