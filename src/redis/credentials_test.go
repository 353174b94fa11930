package redis

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/openrls/ratelimit/src/redis/redistest"
)

func TestReadCredentials(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, content, user, pass, err string
	}{
		{"password", "s3cret\n", "", "s3cret", ""},
		{"user and password", "  rl:pa:ss  \n", "rl", "pa:ss", ""},
		{"empty", " \n", "", "", "empty"},
		{"two lines", "a\nb\n", "", "", "more than one line"},
		{"no password", "rl:\n", "", "", "no password"},
		{"too large", strings.Repeat("x", maxCredentialBytes+1), "", "", "bytes, over 65536"},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_"))
		if err := os.WriteFile(path, []byte(c.content), 0o600); err != nil {
			t.Fatal(err)
		}
		user, pass, err := ReadCredentials(path)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want one saying %q", c.name, err, c.err)
			}
			if s := strings.TrimSpace(c.content); err != nil && s != "" && strings.Contains(err.Error(), s) && len(s) < 100 {
				t.Errorf("%s: the error %q holds the file's content", c.name, err)
			}
			continue
		}
		if err != nil || user != c.user || pass != c.pass {
			t.Errorf("%s: %q %q %v, want %q %q", c.name, user, pass, err, c.user, c.pass)
		}
	}
	// Neither blocks: a FIFO nobody writes, a device without end.
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{dir, fifo, "/dev/zero"} {
		if _, _, err := ReadCredentials(path); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("%s: %v, want not a regular file", path, err)
		}
	}
}

// TestPlainProbeAuthenticatesAsTheClient: the probe that lets the plain
// fixed-window path serve runs on a connection of its own; it must
// authenticate as the client's connections do, REDIS_AUTH_FILE's
// credentials included, or a Redis that requires a password turns the
// plain path off for good.
func TestPlainProbeAuthenticatesAsTheClient(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "pw-1")
	file := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(file, []byte("pw-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]ClientOptions{
		"REDIS_AUTH":      {Auth: "pw-1"},
		"REDIS_AUTH_FILE": {Credentials: FileCredentials(file)},
	} {
		o.URL, o.Type, o.PoolSize, o.Timeout = srv.Addr, "single", 2, testTimeout
		c, err := NewClient(o)
		if err != nil {
			t.Fatal(err)
		}
		ok, known := plainProbe(context.Background(), c)
		c.Close()
		if !ok || !known {
			t.Errorf("%s: plainProbe = %v, %v; want the plain path allowed, and known", name, ok, known)
		}
	}
}
