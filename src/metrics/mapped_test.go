package metrics

import (
	"context"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMappedNamesCarryExtraTags: with EXTRA_TAGS the names a mapping
// matches end with ".__k=v", as the reference's stats library writes
// them, so a mapping written for the reference matches here too.
func TestMappedNamesCarryExtraTags(t *testing.T) {
	file := filepath.Join(t.TempDir(), "m.yaml")
	if err := os.WriteFile(file, []byte(`
mappings:
  - match: 'ratelimit\.service\.rate_limit\.([^.]+)\.([^.]+)\.total_hits\.__env=(.+)'
    match_type: regex
    name: hits
    labels: {domain: "$1", rule: "$2", env: "$3"}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := NewMapped(file)
	if err != nil {
		t.Fatal(err)
	}
	r := New(Options{})
	r.Hit(r.Rule("d", "k", false, "k"), Decision{Hits: 3, Used: 3, Limit: 10, Allowed: true})
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // RunMapped flushes once on the way out, then drains
	r.RunMapped(ctx, m, 0, map[string]string{"env": "acc"})
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	if want := `hits{domain="d",env="acc",rule="k"} 3`; !strings.Contains(string(body), want) {
		t.Errorf("the mapped series lack %s:\n%s", want, body)
	}
}

func TestNewMappedRefusesWhatItCannotRead(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("mappings: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{bad, bad + ": yaml: line"},
		{"/dev/zero", "not a regular file"},
		{filepath.Join(dir, "nope"), "no such file"},
	} {
		if _, err := NewMapped(c.path); err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "PROMETHEUS_MAPPER_YAML: ") {
			t.Errorf("NewMapped(%s) = %v, want PROMETHEUS_MAPPER_YAML: ... %s", c.path, err, c.want)
		}
	}
}
