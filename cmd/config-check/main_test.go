package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/openrls/ratelimit/src/config"
)

func TestRun(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad", "bad.yaml")
	_ = os.MkdirAll(filepath.Dir(bad), 0o755)
	_ = os.WriteFile(good, []byte("domain: g\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644)
	_ = os.WriteFile(bad, []byte("domain: b\ndescriptors:\n  - key: a\n    rate_limit: {unit: eon, requests_per_unit: 1}\n  - value: x\n"), 0o644)
	unreachable := filepath.Join(dir, "unreachable.yaml")
	_ = os.WriteFile(unreachable, []byte("domain: u\ndescriptors:\n  - key: tenant_key\n"), 0o644)
	fifoDir := filepath.Join(dir, "fifo")
	_ = os.MkdirAll(fifoDir, 0o755)
	_ = os.WriteFile(filepath.Join(fifoDir, "a.yaml"), []byte("domain: f\n"), 0o644)
	if err := syscall.Mkfifo(filepath.Join(fifoDir, "pipe.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	leased := filepath.Join(dir, "lease", "ok.yaml")
	_ = os.MkdirAll(filepath.Dir(leased), 0o755)
	_ = os.WriteFile(leased, []byte("domain: l\ndescriptors:\n  - key: api\n    rate_limit: {unit: second, requests_per_unit: 50000, lease: true}\n"), 0o644)
	leaseBad := filepath.Join(dir, "leasebad", "bad.yaml")
	_ = os.MkdirAll(filepath.Dir(leaseBad), 0o755)
	_ = os.WriteFile(leaseBad, []byte("domain: lb\ndescriptors:\n  - key: api\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_log, lease: true}\n"), 0o644)
	badCM := filepath.Join(dir, "cm", "cm.yaml")
	_ = os.MkdirAll(filepath.Dir(badCM), 0o755)
	_ = os.WriteFile(badCM, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata:\n  app.yaml: |\n    domain: a\n    descriptors:\n      - value: v\n"), 0o644)
	neither := filepath.Join(dir, "neither", "n.yaml")
	_ = os.MkdirAll(filepath.Dir(neither), 0o755)
	_ = os.WriteFile(neither, []byte("name: something\n"), 0o644)
	env := map[string]string{"REQUEST_MAX_STRING_BYTES": "8"}
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
		wantErr  []string
	}{
		{"good file", []string{"-dump", good}, 0, "g.a: 1 per second", nil},
		{"summary", []string{"-summary", "../../examples/ratelimit-config.yaml"}, 0, "example: 12 rules (4 wildcard), 13 limits, from ../../examples/ratelimit-config.yaml", nil},
		{"example config", []string{"../../examples/ratelimit-config.yaml"}, 0, "OK: 1 file, domains example", nil},
		{"every error, one per line", []string{filepath.Dir(bad)}, 1, "", []string{
			bad + `:4: descriptors[0].rate_limit.unit: unknown unit "eon"`,
			bad + `:5: descriptors[1]: missing key`}},
		{"a ConfigMap's entries", []string{"../../examples/kubernetes/shared/config.yaml"}, 0, "OK: 1 file, domains example", nil},
		{"unreachable rules are warnings", []string{unreachable}, 0, "OK: 1 file", []string{
			"warning: " + unreachable + ":3: descriptors[0]: never matches: the key is 10 bytes and requests carry at most 8 (REQUEST_MAX_STRING_BYTES)"}},
		{"a FIFO is skipped with a warning", []string{fifoDir}, 0, "OK: 1 file", []string{
			"warning: " + filepath.Join(fifoDir, "pipe.yaml") + ": not a regular file (a named pipe)"}},
		{"explain the example", []string{"-explain", "example", "api_key=k1,path=/api/upload/x;nothing=1", "../../examples/ratelimit-config.yaml"}, 0,
			"  path=/api/upload/x: wildcard \"/api/upload/*\" (../../examples/ratelimit-config.yaml:40)\n" +
				"    also matched, lost: wildcard \"/api/*\" (../../examples/ratelimit-config.yaml:45): \"/api/upload/*\" comes first in the config\n" +
				"  rule: api_key.path_/api/upload/* (../../examples/ratelimit-config.yaml:40)\n" +
				"  limit: 20 per minute, fixed_window  key {7:example7:api_key2:k14:path13:/api/upload/x}:fw60\n" +
				"descriptors[1] nothing=1\n", nil},
		{"explain without descriptors", []string{"-explain", "example"}, 2, "", []string{"usage: config-check -explain"}},
		{"explain a malformed descriptor", []string{"-explain", "example", "novalue", good}, 2, "", []string{`descriptor entry "novalue" is not key=value`}},
		{"lease where it holds", []string{"-dump", filepath.Dir(leased)}, 0, "l.api: 50000 per second, fixed_window, lease", nil},
		{"lease where it does not", []string{filepath.Dir(leaseBad)}, 1, "", []string{
			leaseBad + ":4: descriptors[0].rate_limit.lease: lease holds the limit exactly only for fixed_window and sliding_window, not sliding_log"}},
		{"the examples directory is refused, as the service refuses it", []string{"../../examples"}, 1, "", []string{
			`../../examples/compose/docker-compose-rlqs.yaml:13: services: unknown field "services"`,
			`../../examples/compose/docker-compose-rlqs.yaml:13: missing domain`,
			`../../examples/compose/docker-compose-rlqs.yaml: a Docker Compose file, not a descriptor config: the service reads every file of its config directory and refuses this one`,
			`../../examples/compose/docker-compose.yaml:11: services: unknown field "services"`,
			`../../examples/compose/docker-compose.yaml:11: missing domain`,
			`../../examples/compose/docker-compose.yaml: a Docker Compose file, not a descriptor config: the service reads every file of its config directory and refuses this one`}},
		{"the examples' YAML named one by one: configs checked, the rest named", examplesYAML(t), 0, "OK: 6 files, domains ai_gateway, app, example, exports, quota", []string{
			"skipped: ../../examples/envoy-concurrency.yaml: an Envoy bootstrap, not a descriptor config",
			"skipped: ../../examples/envoy-rlqs.yaml: an Envoy bootstrap, not a descriptor config",
			"skipped: ../../examples/envoy-token-usage.yaml: an Envoy bootstrap, not a descriptor config",
			"skipped: ../../examples/envoy.yaml: an Envoy bootstrap, not a descriptor config",
			"skipped: ../../examples/compose/docker-compose-rlqs.yaml: a Docker Compose file, not a descriptor config",
			"skipped: ../../examples/compose/docker-compose.yaml: a Docker Compose file, not a descriptor config",
			"skipped: ../../examples/envoy-gateway/envoy-gateway.yaml: Kubernetes objects (EnvoyGateway), not a descriptor config",
			"skipped: ../../examples/istio/envoyfilter.yaml: Kubernetes objects (EnvoyFilter), not a descriptor config",
			"skipped: ../../examples/monitoring/prometheus-rules.yaml: Prometheus rules, not a descriptor config",
			"skipped: ../../examples/kubernetes/shared/ratelimit.yaml: Kubernetes objects (Deployment, Service, PodDisruptionBudget), not a descriptor config",
			"skipped: ../../examples/kubernetes/shared/redis.yaml: Kubernetes objects (Deployment, Service), not a descriptor config"}},
		{"explain a domain of a later set", append([]string{"-explain", "app", "remote_address=192.0.2.1"}, examplesYAML(t)...), 0,
			"rule: remote_address (../../examples/kubernetes/sidecar/app.yaml#app-ratelimit-config/app.yaml:3)", nil},
		{"a summary of every set, as the OK line counts", append([]string{"-summary"}, examplesYAML(t)...), 0,
			"app: 1 rule (0 wildcard), 1 limit, from ../../examples/kubernetes/sidecar/app.yaml#app-ratelimit-config/app.yaml", nil},
		{"a ConfigMap's bad entry is an error", []string{badCM}, 1, "", []string{badCM + "#app.yaml:3: descriptors[0]: missing key"}},
		{"a file like nothing known is checked as a config", []string{neither}, 1, "", []string{neither + `:1: name: unknown field "name"`}},
		{"flags after the path", []string{"../../examples/ratelimit-config.yaml", "-summary"}, 0, "example", nil},
		{"explain with its flags after the path", []string{"../../examples/ratelimit-config.yaml", "-explain", "example", "generic_key=demo"}, 0,
			"descriptors[0] generic_key=demo", nil},
		{"no args", nil, 2, "", []string{"usage"}},
		{"help names PATH", []string{"-h"}, 0, "config-check [-merge] [-ignore-dotfiles] [-dump | -summary] PATH...", nil},
		{"--help", []string{"--help"}, 0, "-explain string", nil},
		{"version", []string{"-version"}, 0, "ratelimit ", nil},
		{"missing path", []string{filepath.Join(dir, "nope")}, 1, "", []string{"no such file"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(tc.args, func(k string) string { return env[k] }, &out, &errb)
			if code != tc.wantCode || !strings.Contains(out.String(), tc.wantOut) {
				t.Errorf("run(%v) = %d, stdout %q; want %d and %q (stderr %q)", tc.args, code, out.String(), tc.wantCode, tc.wantOut, errb.String())
			}
			lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
			for i, w := range tc.wantErr {
				if i >= len(lines) || !strings.Contains(lines[i], w) {
					t.Errorf("stderr line %d = %q, want %q (all: %q)", i, lines, w, errb.String())
				}
			}
		})
	}
}

// TestOverlappingWildcards: a pair of wildcards that the two values of
// WILDCARD_PRECEDENCE decide differently is a warning naming both, worded
// for the precedence in the environment, and the exit code stays 0; an
// unknown precedence is bad usage.
func TestOverlappingWildcards(t *testing.T) {
	file := filepath.Join(t.TempDir(), "w.yaml")
	_ = os.WriteFile(file, []byte("domain: w\ndescriptors:\n  - key: path\n    value: /api/*\n    rate_limit: {unit: minute, requests_per_unit: 100}\n"+
		"  - key: path\n    value: /api/upload/*\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"), 0o644)
	for _, tc := range []struct {
		precedence, want string
		code             int
	}{
		{"", `warning: ` + file + `:6: descriptors[1]: wildcard "/api/upload/*" overlaps "/api/*" (` + file + `:3), which comes first: those values take "/api/*"'s limits`, 0},
		{"most_literal", "those values take this one's limits here (WILDCARD_PRECEDENCE=most_literal)", 0},
		{"longest", `WILDCARD_PRECEDENCE: want first or most_literal, got "longest"`, 2},
	} {
		var out, errb bytes.Buffer
		code := run([]string{"-explain", "w", "path=/api/upload/a", file}, func(k string) string {
			if k == "WILDCARD_PRECEDENCE" {
				return tc.precedence
			}
			return ""
		}, &out, &errb)
		if code != tc.code || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("WILDCARD_PRECEDENCE=%q: exit %d, stderr %q; want %d and %q", tc.precedence, code, errb.String(), tc.code, tc.want)
		}
		wantRule := map[string]string{"": "rule: path_/api/* ", "most_literal": "rule: path_/api/upload/* "}[tc.precedence]
		if code == 0 && !strings.Contains(out.String(), wantRule) {
			t.Errorf("WILDCARD_PRECEDENCE=%q: -explain = %q, want %q", tc.precedence, out.String(), wantRule)
		}
	}
}

// examplesYAML lists the YAML files of examples/, in the order a shell's
// globs would.
func examplesYAML(t *testing.T) []string {
	var out []string
	for _, g := range []string{"../../examples/*.yaml", "../../examples/*/*.yaml", "../../examples/*/*/*.yaml"} {
		m, err := filepath.Glob(g)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m...)
	}
	return out
}

// TestDirectoryPastTheTotal: a directory whose files together pass
// config.MaxConfigBytes is refused by config-check as the service refuses
// it, naming the file that passed the total.
func TestDirectoryPastTheTotal(t *testing.T) {
	dir := t.TempDir()
	each := config.MaxFileBytes - 1<<20
	for i := range config.MaxConfigBytes/each + 1 {
		body := fmt.Sprintf("domain: d%d\n#", i)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d.yaml", i)), append([]byte(body), bytes.Repeat([]byte("x"), each-len(body))...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out, errb bytes.Buffer
	past := filepath.Join(dir, fmt.Sprintf("f%d.yaml", config.MaxConfigBytes/each))
	if code := run([]string{dir}, func(string) string { return "" }, &out, &errb); code != 1 || !strings.Contains(errb.String(), past+": the config's files total more than") {
		t.Errorf("config-check on %d bytes in all: exit %d, stderr %q; want 1 and the service's error naming %s", config.MaxConfigBytes, code, errb.String(), past)
	}
}
