package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestConfigCheckAgreesWithTheService: config-check DIR says OK exactly
// when the service, given DIR as its config directory, starts; on the
// repository's examples/ and on directories shaped as users' are (a
// ConfigMap's extension-less keys, a second YAML document, an Envoy
// bootstrap or a JSON file beside the configs, a dotfile).
func TestConfigCheckAgreesWithTheService(t *testing.T) {
	check := filepath.Join(t.TempDir(), "config-check")
	if out, err := exec.Command("go", "build", "-o", check, "../cmd/config-check").CombinedOutput(); err != nil {
		t.Fatalf("build config-check: %v\n%s", err, out)
	}
	const valid = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	for _, tc := range []struct {
		name   string
		files  map[string]string // nil: a copy of examples/
		wantOK bool
	}{
		{"the examples directory", nil, false},
		{"an extension-less file beside a YAML one", map[string]string{"a.yaml": valid, "more-limits": "domain: m\n"}, true},
		{"a second YAML document", map[string]string{"a.yaml": valid + "---\nnot: read\n"}, true},
		{"an Envoy bootstrap beside the config", map[string]string{"a.yaml": valid, "envoy.yaml": "admin: {}\nstatic_resources: {}\n"}, false},
		{"a JSON file beside the config", map[string]string{"a.yaml": valid, "notes.json": `{"x": 1}`}, false},
		{"a dotfile that is no config", map[string]string{"a.yaml": valid, ".notes.yaml": "x: 1\n"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := writeConfig(t, tc.files)
			dir := filepath.Join(env["RUNTIME_ROOT"], "ratelimit", "config")
			if tc.files == nil {
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
				if err := os.CopyFS(dir, os.DirFS("../examples")); err != nil {
					t.Fatal(err)
				}
			}
			out, err := exec.Command(check, dir).CombinedOutput()
			if ok := err == nil; ok != tc.wantOK {
				t.Fatalf("config-check %s: ok %v, want %v\n%s", tc.name, ok, tc.wantOK, out)
			}
			if tc.wantOK {
				start(t, env) // fails the test if the service does not start
				return
			}
			if code, stderr := runToExit(t, env); code == 0 {
				t.Errorf("config-check refused it, the service exited 0:\n%s", stderr)
			}
		})
	}
}
