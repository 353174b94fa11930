package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// TestRedisAuthFileRotatedTwiceUnderLoad runs the binary against a Redis
// with requirepass and REDIS_AUTH_FILE, under load from four callers, and
// rotates the secret twice as an operator would: the new password in
// Redis and in the file, then every old connection killed; then an ACL
// user with the default user switched off, the file holding
// user:password. After each rotation decisions are answered again
// without a restart; every answer is OK or Unavailable (the default
// failure policy), and the counter holds every admitted hit, plus at most
// the failed ones (a hit Redis ran whose reply the kill cut off). No
// secret is ever logged.
func TestRedisAuthFileRotatedTwiceUnderLoad(t *testing.T) {
	const first, second, third = "first-secret-1", "second-secret-2", "third-secret-3"
	srv := redistest.Start(t, "--requirepass", first)
	admin := func(user, pass string) *goredis.Client {
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, Username: user, Password: pass, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		return c
	}
	file := filepath.Join(t.TempDir(), "redis-auth")
	write := func(s string) {
		// As a Secret mount or a refresher does: a new file renamed in.
		tmp := file + ".new"
		if err := os.WriteFile(tmp, []byte(s+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write(first)
	env := writeConfig(t, map[string]string{"auth.yaml": `
domain: auth
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 100000000}
`})
	env["REDIS_URL"] = srv.Addr
	env["REDIS_AUTH_FILE"] = file
	env["LOG_LEVEL"] = "debug"
	p := start(t, env)

	var ok, failed atomic.Int64
	var okAt atomic.Int64 // ok's count when a rotation began
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := &rlsv3.RateLimitRequest{Domain: "auth", Descriptors: descs(configtest.Desc("k=load"))}
			for i := 0; i < 200000; i++ { // bounded; stopped long before
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := p.client().ShouldRateLimit(ctx, req)
				cancel()
				switch {
				case err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
					ok.Add(1)
				case err != nil && strings.Contains(err.Error(), "Unavailable"):
					failed.Add(1)
				default:
					t.Errorf("answer %v, error %v: want OK, or Unavailable while the store refuses us", resp.GetOverallCode(), err)
					return
				}
			}
		}()
	}
	served := func(what string) {
		t.Helper()
		okAt.Store(ok.Load())
		eventually(t, what, func() bool { return ok.Load() > okAt.Load()+50 })
	}
	served("decisions with the first password")

	// Rotation 1: a new password.
	a := admin("", first)
	if err := a.ConfigSet(context.Background(), "requirepass", second).Err(); err != nil {
		t.Fatal(err)
	}
	write(second)
	_ = admin("", second).Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal").Err()
	served("decisions after the password was rotated and the old connections killed")

	// Rotation 2: an ACL user, the default user off.
	b := admin("", second)
	if err := b.Do(context.Background(), "ACL", "SETUSER", "rl", "on", ">"+third, "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	write("rl:" + third)
	c := admin("rl", third)
	if err := c.Do(context.Background(), "ACL", "SETUSER", "default", "off").Err(); err != nil {
		t.Fatal(err)
	}
	_ = c.Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal").Err()
	served("decisions as user rl, the default user off")

	close(stop)
	wg.Wait()
	keys, err := c.Keys(context.Background(), "*k4:load}*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("counter keys %q (%v), want one", keys, err)
	}
	n, err := c.Get(context.Background(), keys[0]).Int64()
	if err != nil {
		t.Fatal(err)
	}
	if n < ok.Load() || n > ok.Load()+failed.Load() {
		t.Errorf("the counter holds %d hits; %d were admitted and %d failed: it must hold every admitted one, and no more than the failed ones beside", n, ok.Load(), failed.Load())
	}
	t.Logf("%d admitted, %d Unavailable across two rotations; counter %d", ok.Load(), failed.Load(), n)
	logs := p.stderr.String()
	for _, secret := range []string{first, second, third} {
		if strings.Contains(logs, secret) {
			t.Errorf("the logs hold a secret (%q):\n%s", secret, logs)
		}
	}
}

// TestRedisAuthFileThatCannotServeStopsStartUp: a missing, empty or
// unreadable REDIS_AUTH_FILE, or one beside REDIS_AUTH, is named at
// start-up, before any connection.
func TestRedisAuthFileThatCannotServeStopsStartUp(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(good, []byte("pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"missing", map[string]string{"REDIS_AUTH_FILE": filepath.Join(dir, "nope")}, "REDIS_AUTH_FILE: credentials file: open"},
		{"empty", map[string]string{"REDIS_AUTH_FILE": empty}, "REDIS_AUTH_FILE: credentials file " + empty + ": empty"},
		{"a directory", map[string]string{"REDIS_AUTH_FILE": dir}, "not a regular file"},
		{"beside REDIS_AUTH", map[string]string{"REDIS_AUTH_FILE": good, "REDIS_AUTH": "x"}, "REDIS_AUTH_FILE: and REDIS_AUTH are both set"},
		{"per-second", map[string]string{"REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "127.0.0.1:1",
			"REDIS_PERSECOND_AUTH_FILE": empty}, "REDIS_PERSECOND_AUTH_FILE: credentials file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
			env["REDIS_URL"] = "127.0.0.1:1"
			for k, v := range tc.env {
				env[k] = v
			}
			exitsSaying(t, env, tc.want)
		})
	}
}

// iamEnv is ElastiCache IAM authentication with static AWS credentials
// from the environment (the first link of the SDK's default chain), and
// nothing else of AWS reachable: no shared files, no instance metadata.
func iamEnv(addr string) map[string]string {
	return map[string]string{
		"REDIS_URL": addr, "REDIS_AWS_IAM_AUTH": "true", "REDIS_AWS_IAM_USER_ID": "rl-user", "REDIS_AWS_IAM_CACHE_NAME": "rl-cache",
		"AWS_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
	}
}

// TestRedisAWSIAMAuthConnectsAsTheUser runs the binary with
// REDIS_AWS_IAM_AUTH against a local Redis whose only user is the
// ElastiCache user id, without a password check (a local Redis cannot
// verify AWS signatures; the token itself is held by src/elasticache's
// tests against SigV4 worked out independently): every connection
// authenticates as that user, the plain fixed-window path included, and
// decisions are counted. Without TLS the start-up log says ElastiCache
// needs it.
func TestRedisAWSIAMAuthConnectsAsTheUser(t *testing.T) {
	srv := redistest.Start(t)
	if _, err := srv.Do("ACL", "SETUSER", "rl-user", "on", "nopass", "~*", "&*", "+@all"); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("ACL", "SETUSER", "default", "off"); err != nil {
		t.Fatal(err)
	}
	admin := goredis.NewClient(&goredis.Options{Addr: srv.Addr, Username: "rl-user", Password: "x", MaxRetries: -1})
	t.Cleanup(func() { admin.Close() })
	env := writeConfig(t, map[string]string{"auth.yaml": `
domain: auth
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 3}
`})
	for k, v := range iamEnv(srv.Addr) {
		env[k] = v
	}
	p := start(t, env)
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK,
		rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := p.should(t, "auth", configtest.Desc("k=iam")).GetOverallCode(); got != want {
			t.Fatalf("call %d: %v, want %v", i+1, got, want)
		}
	}
	// The plain path's probe (a transaction on a connection of its own)
	// authenticated too, and a plain decision's transaction followed.
	// The probe runs in the background: decisions go through the function
	// until it has passed, so more of them are made until one is plain.
	i := 0
	eventually(t, "the probe's transaction and a plain decision's (EXEC twice)", func() bool {
		i++
		p.should(t, "auth", configtest.Desc(fmt.Sprintf("k=more-%d", i)))
		stats, err := admin.Info(context.Background(), "commandstats").Result()
		return err == nil && redistest.ParseCommandStats(stats)["exec"].Calls >= 2
	})
	clients, err := admin.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	var theirs int
	for _, line := range strings.Split(strings.TrimSpace(clients), "\n") {
		if !strings.Contains(line, "user=rl-user") {
			t.Errorf("a connection not as the IAM user: %s", line)
		}
		theirs++
	}
	if theirs < 2 { // the service's, and ours
		t.Errorf("CLIENT LIST has %d connections, want the service's beside ours:\n%s", theirs, clients)
	}
	if want := "REDIS_AWS_IAM_AUTH: ElastiCache accepts IAM authentication over TLS only"; !strings.Contains(p.stderr.String(), want) {
		t.Errorf("start-up log lacks %q:\n%s", want, p.stderr)
	}
	if strings.Contains(p.stderr.String(), "wJalrXUtnFEMI") || strings.Contains(p.stderr.String(), "X-Amz-Signature") {
		t.Errorf("the logs hold a secret or a token:\n%s", p.stderr)
	}
}

// TestRedisAWSIAMAuthThatCannotServeStopsStartUp: IAM beside a password,
// without its user or cache, or without any AWS region, is named at
// start-up.
func TestRedisAWSIAMAuthThatCannotServeStopsStartUp(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"beside REDIS_AUTH", map[string]string{"REDIS_AUTH": "x"}, "REDIS_AWS_IAM_AUTH: and REDIS_AUTH or REDIS_AUTH_FILE are both set"},
		{"no user", map[string]string{"REDIS_AWS_IAM_USER_ID": unset}, "REDIS_AWS_IAM_AUTH: needs REDIS_AWS_IAM_USER_ID"},
		{"no region", map[string]string{"AWS_REGION": unset}, "REDIS_AWS_IAM_AUTH: no AWS region"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
			for k, v := range iamEnv("127.0.0.1:1") {
				env[k] = v
			}
			for k, v := range tc.env {
				env[k] = v
			}
			exitsSaying(t, env, tc.want)
		})
	}
}
