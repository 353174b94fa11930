package config

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestOnlyRegularFilesAreConfig: a FIFO, a socket, a device and a dangling
// link named *.yaml are skipped with a reason, never opened for a blocking
// read; regular files and links to them are read.
func TestOnlyRegularFilesAreConfig(t *testing.T) {
	dir := t.TempDir()
	good := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "target.txt"), []byte("domain: e\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("target.txt", filepath.Join(dir, "linked.yaml")); err != nil {
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
	if !errors.Is(skipped[filepath.Join(dir, "fifo.yaml")], ErrNotRegular) {
		t.Errorf("skipped FIFO reason = %v, want ErrNotRegular", skipped[filepath.Join(dir, "fifo.yaml")])
	}

	// A FIFO that turns up between listing and reading is refused at once.
	for _, name := range []string{"fifo.yaml", "zero.yaml"} {
		if _, err := ReadFile(filepath.Join(dir, name)); !errors.Is(err, ErrNotRegular) {
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
