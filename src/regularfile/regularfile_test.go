package regularfile

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "small")
	if err := os.WriteFile(small, []byte("12345"), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(small, link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path string
		max        int64
		want       string
		notRegular bool
		tooLarge   bool
	}{
		{"a regular file", small, 5, "12345", false, false},
		{"a link to one", link, 5, "12345", false, false},
		{"past the bound", small, 4, "", false, true},
		{"a FIFO nobody writes (does not block)", fifo, 5, "", true, false},
		{"a device without end", "/dev/zero", 5, "", true, false},
		{"a directory", dir, 5, "", true, false},
	} {
		got, err := Read(c.path, c.max)
		var big *TooLargeError
		switch {
		case c.notRegular && !errors.Is(err, ErrNotRegular):
			t.Errorf("%s: %v, want ErrNotRegular", c.name, err)
		case c.tooLarge && !errors.As(err, &big):
			t.Errorf("%s: %v, want a TooLargeError", c.name, err)
		case !c.notRegular && !c.tooLarge && (err != nil || string(got) != c.want):
			t.Errorf("%s: %q, %v; want %q", c.name, got, err, c.want)
		}
	}
}
