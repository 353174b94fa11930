package redis

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/redis/redistest"
	"github.com/openrls/ratelimit/src/tlstest"
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

func TestClientTLS(t *testing.T) {
	dir := t.TempDir()
	ca, rogue := tlstest.NewCA(t, "redis-ca"), tlstest.NewCA(t, "rogue")
	sc, sk := ca.Issue(t, "redis") // valid for 127.0.0.1, not for "localhost"
	cc, ck := ca.Issue(t, "ratelimit")
	caFile := tlstest.Write(t, dir, "ca.pem", ca.PEM)
	rogueFile := tlstest.Write(t, dir, "rogue.pem", rogue.PEM)
	certFile, keyFile := tlstest.Write(t, dir, "client.pem", cc), tlstest.Write(t, dir, "client.key", ck)
	inspect, err := TLSConfig(caFile, certFile, keyFile, false)
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.StartTLS(t, tlstest.Write(t, dir, "server.pem", sc), tlstest.Write(t, dir, "server.key", sk), caFile, inspect,
		"--tls-auth-clients", "yes", "--user", "default", "off", "--user", "rl", "on", ">pw", "~*", "+@all")
	localhost := strings.Replace(srv.Addr, "127.0.0.1", "localhost", 1)
	tests := []struct {
		name         string
		addr         string
		ca, cert     string
		skipHostname bool
		ok           bool
	}{
		{"client certificate, right CA, ACL user", srv.Addr, caFile, certFile, false, true},
		{"no client certificate", srv.Addr, caFile, "", false, false},
		{"server from an untrusted CA", srv.Addr, rogueFile, certFile, false, false},
		{"name not in the certificate", localhost, caFile, certFile, false, false},
		{"name not in the certificate, hostname check skipped", localhost, caFile, certFile, true, true},
		{"hostname check skipped still verifies the chain", localhost, rogueFile, certFile, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := ""
			if tc.cert != "" {
				key = keyFile
			}
			cfg, err := TLSConfig(tc.ca, tc.cert, key, tc.skipHostname)
			if err != nil {
				t.Fatal(err)
			}
			c, err := NewClient(ClientOptions{URL: tc.addr, Type: "single", Auth: "rl:pw", TLS: cfg, PoolSize: 1, Timeout: testTimeout})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s, _ := New(c, Options{})
			_, err = s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: "{tls}:k", Rule: limiter.Rule{Limit: 1, Period: time.Second}, Cost: 1}}})
			if (err == nil) != tc.ok {
				t.Errorf("Apply() error = %v, want success %v", err, tc.ok)
			}
		})
	}
}

// TestPoolTimeout: with every pooled connection busy, a call waits
// PoolTimeout for one (REDIS_POOL_ON_EMPTY_BEHAVIOR=WAIT or ERROR with its
// wait duration) and then fails with the pool's error, not the Redis
// timeout's; once a connection is free again, calls go through.
func TestPoolTimeout(t *testing.T) {
	srv := redistest.Start(t)
	uc, err := NewClient(ClientOptions{URL: srv.Addr, Type: "single", PoolSize: 1, PoolTimeout: 20 * time.Millisecond, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	c := uc.(*goredis.Client)
	ctx := context.Background()
	held := c.Conn()
	if err := held.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	err = c.Ping(ctx).Err()
	if err == nil || !strings.Contains(err.Error(), "pool timeout") {
		t.Errorf("Ping with the only connection held = %v, want a pool timeout", err)
	}
	held.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Errorf("Ping after the connection came back = %v", err)
	}
}
