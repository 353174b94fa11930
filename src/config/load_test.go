package config

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestEveryFileIsRead: as envoyproxy/ratelimit reads its runtime
// directory, every regular file is a config file, whatever its name ends
// with (a ConfigMap's keys often have none), and a file's YAML documents
// after the first are not read, but said (Options.Noted).
func TestEveryFileIsRead(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"a.yaml":      "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"more-limits": "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
		"c.json":      `{"domain": "c", "descriptors": [{"key": "k", "rate_limit": {"unit": "hour", "requests_per_unit": 2}}]}`,
		"two-docs.yml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n---\n" +
			"domain: e\ndescriptors: []\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var noted []string
	cfg, err := LoadDir(dir, false, Options{Noted: func(p, note string) { noted = append(noted, filepath.Base(p)+": "+note) }})
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Domains(); len(got) != 4 || got[0] != "a" || got[1] != "b" || got[2] != "c" || got[3] != "d" {
		t.Errorf("domains %v, want a, b (no extension), c (JSON) and d (the first document of two-docs.yml)", got)
	}
	if len(noted) != 1 || !strings.Contains(noted[0], "two-docs.yml: the YAML documents from line 5 on are not read") {
		t.Errorf("noted %q, want the second document of two-docs.yml", noted)
	}
}

// TestOnlyRegularFilesAreConfig: a FIFO, a socket, a device and a dangling
// link named *.yaml are skipped with a reason, never opened for a blocking
// read; regular files and links to them are read.
func TestOnlyRegularFilesAreConfig(t *testing.T) {
	dir := t.TempDir()
	good := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	elsewhere := t.TempDir() // a link's target outside the directory: not read twice
	if err := os.WriteFile(filepath.Join(elsewhere, "target.txt"), []byte("domain: e\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(elsewhere, "target.txt"), filepath.Join(dir, "linked.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(dir, "sock.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := os.Symlink("/dev/zero", filepath.Join(dir, "zero.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("missing.yaml", filepath.Join(dir, "dangling.yaml")); err != nil {
		t.Fatal(err)
	}

	files, skipped, err := FindFiles(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	wantFiles := []string{filepath.Join(dir, "a.yaml"), filepath.Join(dir, "linked.yaml")}
	if len(files) != 2 || files[0] != wantFiles[0] || files[1] != wantFiles[1] {
		t.Errorf("FindFiles files = %q, want %q", files, wantFiles)
	}
	for _, name := range []string{"fifo.yaml", "sock.yaml", "zero.yaml", "dangling.yaml"} {
		if _, ok := skipped[filepath.Join(dir, name)]; !ok {
			t.Errorf("FindFiles did not skip %s (skipped: %v)", name, skipped)
		}
	}
	if !errors.Is(skipped[filepath.Join(dir, "fifo.yaml")], errNotRegular) {
		t.Errorf("skipped FIFO reason = %v, want ErrNotRegular", skipped[filepath.Join(dir, "fifo.yaml")])
	}

	// A FIFO that turns up between listing and reading is refused at once.
	for _, name := range []string{"fifo.yaml", "zero.yaml"} {
		if _, err := ReadFile(filepath.Join(dir, name)); !errors.Is(err, errNotRegular) {
			t.Errorf("ReadFile(%s) error = %v, want ErrNotRegular", name, err)
		}
	}

	var heard []string
	cfg, err := LoadDir(dir, false, Options{Skipped: func(p string, _ error) { heard = append(heard, filepath.Base(p)) }})
	if err != nil {
		t.Fatalf("LoadDir beside a FIFO: %v", err)
	}
	if got := cfg.Domains(); len(got) != 2 {
		t.Errorf("LoadDir domains = %v, want d and e", got)
	}
	if len(heard) != 4 {
		t.Errorf("Options.Skipped heard %v, want the 4 entries that are not regular files", heard)
	}
}

func TestReadFileRefusesHugeFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "huge.yaml")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(MaxFileBytes + 1); err != nil { // sparse: no disk used
		t.Fatal(err)
	}
	f.Close()
	var ce *Error
	if _, err := ReadFile(path); !errors.As(err, &ce) || ce.File != path {
		t.Errorf("ReadFile(%d bytes) error = %v, want a *config.Error naming the file", MaxFileBytes+1, err)
	}
}

// TestConfigTotalIsBounded: files each under MaxFileBytes that together
// pass MaxConfigBytes are refused, naming the file that passed it, and
// the files after it are not read.
func TestConfigTotalIsBounded(t *testing.T) {
	dir := t.TempDir()
	each := MaxFileBytes - 1<<20
	n := MaxConfigBytes/each + 2 // the last is past the bound
	var paths []string
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("f%d.yaml", i))
		body := fmt.Sprintf("domain: d%d\n#", i)
		if err := os.WriteFile(p, append([]byte(body), bytes.Repeat([]byte("x"), each-len(body))...), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	// The last file is not a config at all: were it read, its error
	// would show.
	if err := os.WriteFile(paths[n-1], []byte("- not a mapping\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadFiles(paths, Options{})
	var ce *Error
	past := paths[MaxConfigBytes/each]
	if !errors.As(err, &ce) || ce.File != past || !strings.Contains(err.Error(), "total more than") {
		t.Fatalf("LoadFiles over %d bytes in all: %v, want an error naming %s", MaxConfigBytes, err, past)
	}
	if strings.Contains(err.Error(), "mapping") {
		t.Errorf("a file after the bound was read: %v", err)
	}
	if _, err := LoadFiles(paths[:MaxConfigBytes/each], Options{}); err != nil {
		t.Errorf("files under the bound in all: %v", err)
	}
}

// TestFilesPlainlyNotConfigsAreNamed: a file of the config directory that
// does not parse and is plainly something else (text, JSON, a Grafana
// dashboard, an Envoy bootstrap, Kubernetes objects) is named as such,
// with why the service read it; a broken descriptor config is not.
func TestFilesPlainlyNotConfigsAreNamed(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
	}{
		{"NOTES.txt", "remember to raise the demo limit\n", "text, not a descriptor config"},
		{"dashboard.json", `{"title": "rate limits", "panels": [{"type": "graph"}]}`, "a Grafana dashboard (JSON), not a descriptor config"},
		{"data.json", `["a", "b"]`, "JSON, not a descriptor config"},
		{"envoy.yaml", "static_resources:\n  listeners: []\n", "an Envoy bootstrap, not a descriptor config"},
		{"deploy.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: rl}\n", "Kubernetes objects (Service), not a descriptor config"},
		{"broken.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", ""},
	} {
		dir := t.TempDir()
		p := filepath.Join(dir, tc.name)
		if err := os.WriteFile(p, []byte(tc.body), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := LoadDir(dir, false, Options{})
		switch {
		case err == nil:
			t.Errorf("%s: loaded", tc.name)
		case tc.want == "" && strings.Contains(err.Error(), "not a descriptor config"):
			t.Errorf("%s, a broken descriptor config: %v, named as something else", tc.name, err)
		case tc.want != "" && (!strings.Contains(err.Error(), p+": "+tc.want) || !strings.Contains(err.Error(), "reads every file of its config directory")):
			t.Errorf("%s: %v\nwant %q and why it was read", tc.name, err, tc.want)
		}
	}
	// A descriptor config written in JSON (it is YAML) is read as one.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "c.json"), []byte(`{"domain": "j", "descriptors": [{"key": "k"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadDir(dir, false, Options{}); err != nil {
		t.Errorf("a descriptor config in JSON: %v", err)
	}
}
