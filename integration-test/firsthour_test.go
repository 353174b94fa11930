package integration

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestStartupErrorsNameTheSettings: start-up errors a user causes name
// the settings to change: a config directory that does not exist (and the
// common mistake of a RUNTIME_ROOT that already ends in the app
// directory), and a port another process holds.
func TestStartupErrorsNameTheSettings(t *testing.T) {
	t.Run("config directory", func(t *testing.T) {
		env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
		env["RUNTIME_ROOT"] = filepath.Join(env["RUNTIME_ROOT"], "ratelimit", "config")
		env["RUNTIME_SUBDIRECTORY"] = ""
		code, out := runToExit(t, env)
		for _, want := range []string{"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "FORCE_START_WITHOUT_INITIAL_CONFIG",
			`RUNTIME_ROOT already ends in "config"`} {
			if code == 0 || !strings.Contains(out, want) {
				t.Errorf("exit %d, output lacks %s:\n%s", code, want, out)
			}
		}
	})
	t.Run("port in use", func(t *testing.T) {
		held, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
		env["PORT"] = strconv.Itoa(held.Addr().(*net.TCPAddr).Port)
		code, out := runToExit(t, env)
		if code == 0 || !strings.Contains(out, "set by HOST and PORT") || !strings.Contains(out, "address already in use") {
			t.Errorf("exit %d, want the error to name HOST and PORT:\n%s", code, out)
		}
	})
}

// TestLinkedConfigErrorsNameTheTarget: a config file linked into the
// config directory from elsewhere (as make run links the example) is named
// in errors by the file a user edits, the link's target; a Kubernetes
// ConfigMap's entries, linked within the directory, keep their own names.
func TestLinkedConfigErrorsNameTheTarget(t *testing.T) {
	elsewhere := t.TempDir()
	target := filepath.Join(elsewhere, "edited.yaml")
	writeFiles(t, elsewhere, map[string]string{"edited.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"})
	env := writeConfig(t, map[string]string{})
	dir := filepath.Join(env["RUNTIME_ROOT"], "ratelimit", "config")
	if err := os.Symlink(target, filepath.Join(dir, "linked.yaml")); err != nil {
		t.Fatal(err)
	}
	code, out := runToExit(t, env)
	if code == 0 || !strings.Contains(out, target+":4: descriptors[0].rate_limit.unit") || strings.Contains(out, "linked.yaml:4") {
		t.Errorf("exit %d, want the error at %s:4, not the link's name:\n%s", code, target, out)
	}

	// A ConfigMap: a.yaml -> ..data/a.yaml, ..data -> ..2026_11_26/.
	env = writeConfig(t, map[string]string{})
	dir = filepath.Join(env["RUNTIME_ROOT"], "ratelimit", "config")
	writeFiles(t, filepath.Join(dir, "..2026_11_26"), map[string]string{"a.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: eon, requests_per_unit: 1}\n"})
	for link, to := range map[string]string{"..data": "..2026_11_26", "a.yaml": "..data/a.yaml"} {
		if err := os.Symlink(to, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	code, out = runToExit(t, env)
	if want := filepath.Join(dir, "a.yaml") + ":4:"; code == 0 || !strings.Contains(out, want) {
		t.Errorf("exit %d, want the ConfigMap entry's own name %s:\n%s", code, want, out)
	}
}

// TestIgnoredSettingsAreNamed: what the chosen backend does not read is
// named at start-up, not dropped without a word: REDIS_URL beside
// BACKEND_TYPE=memory, and a config's lease: true on a store that does not
// lease (memory and memcache; Redis with LEASE_INTERVAL=0).
func TestIgnoredSettingsAreNamed(t *testing.T) {
	leased := map[string]string{"l.yaml": "domain: l\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 500, lease: true}\n"}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"memory with REDIS_URL", map[string]string{"BACKEND_TYPE": "memory", "REDIS_URL": "127.0.0.1:1"}, []string{
			"REDIS_URL: ignored: the backend is memory",
			"domain l: lease: true on 1 limits is ignored: the embedded store"}},
		{"memcache", map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "127.0.0.1:1"}, []string{
			"domain l: lease: true on 1 limits is ignored: BACKEND_TYPE=memcache"}},
		{"redis without leasing", map[string]string{"REDIS_URL": "127.0.0.1:1", "LEASE_INTERVAL": "0", "MEMCACHE_HOST_PORT": "127.0.0.1:2"}, []string{
			"MEMCACHE_HOST_PORT: ignored: the backend is redis",
			"domain l: lease: true on 1 limits is ignored: LEASE_INTERVAL=0"}},
		{"a Prometheus mapping without USE_PROMETHEUS", map[string]string{"PROMETHEUS_MAPPER_YAML": "/nowhere.yaml"}, []string{
			"PROMETHEUS_MAPPER_YAML: ignored: USE_PROMETHEUS is not true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := writeConfig(t, leased)
			for k, v := range tc.env {
				env[k] = v
			}
			p := start(t, env)
			for _, w := range tc.want {
				if !strings.Contains(p.stderr.String(), w) {
					t.Errorf("start-up log lacks %q:\n%s", w, p.stderr)
				}
			}
		})
	}
}
