package redis

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

func TestClientConnects(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "redis.sock")
	pass := redistest.Start(t, "--requirepass", "s3cret")
	acl := redistest.Start(t, "--user", "default", "off", "--user", "rl", "on", ">pw", "~*", "+@all")
	redistest.Start(t, "--unixsocket", sock, "--unixsocketperm", "700")
	tests := []struct {
		name    string
		opts    ClientOptions
		wantErr string
	}{
		{"password", ClientOptions{URL: pass.Addr, Auth: "s3cret"}, ""},
		{"wrong password", ClientOptions{URL: pass.Addr, Auth: "nope"}, "WRONGPASS"},
		{"acl user:password", ClientOptions{URL: acl.Addr, Auth: "rl:pw"}, ""},
		{"unix socket", ClientOptions{URL: sock, Network: "unix"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Type, tc.opts.PoolSize, tc.opts.Timeout = "single", 2, 2*time.Second
			c, err := NewClient(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s, err := New(c, Options{})
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: "{c}:k", Rule: limiter.Rule{Limit: 1, Period: time.Second}, Cost: 1}}})
			if tc.wantErr == "" && err != nil {
				t.Errorf("Apply() error: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Apply() error = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestNewClientRejectsBadURLs(t *testing.T) {
	for _, o := range []ClientOptions{
		{URL: "", Type: "single"},
		{URL: "a:1,b:2", Type: "single"},
		{URL: "onlymaster", Type: "sentinel"},
		{URL: "a:1", Type: "ring"},
	} {
		if _, err := NewClient(o); err == nil {
			t.Errorf("NewClient(%+v) = nil error, want one", o)
		}
	}
}

func TestSplitAuth(t *testing.T) {
	for in, want := range map[string][2]string{"pw": {"", "pw"}, "u:pw": {"u", "pw"}, "u:p:w": {"u", "p:w"}, "": {"", ""}} {
		if u, p := splitAuth(in); u != want[0] || p != want[1] {
			t.Errorf("splitAuth(%q) = %q, %q, want %q", in, u, p, want)
		}
	}
}
