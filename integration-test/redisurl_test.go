package integration

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/redis"
	"github.com/openrls/ratelimit/src/redis/redistest"
	"github.com/openrls/ratelimit/src/tlstest"
)

// TestRedisURL: REDIS_URL as envoyproxy/ratelimit's Redis client reads it,
// a redis:// URL with a password, user name and database, through the
// binary: the counts land in that database, and the password is in no log
// line nor in /healthcheck's answer.
func TestRedisURL(t *testing.T) {
	const pw = "url-s3cret-pw"
	s := redistest.Start(t, "--requirepass", pw, "--user", "alice", "on", ">"+pw, "~*", "&*", "+@all")
	port := strconv.Itoa(s.Port)
	tests := []struct {
		name, url string
		db        int
	}{
		{"password and database in the path", "redis://:" + pw + "@127.0.0.1:" + port + "/2", 2},
		{"password and database in the query", "redis://127.0.0.1:" + port + "?password=" + pw + "&db=3", 3},
		{"user name", "redis://alice:" + pw + "@127.0.0.1:" + port + "/4", 4},
		{"no database", "redis://:" + pw + "@127.0.0.1:" + port, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := start(t, redisEnv(t, map[string]string{"REDIS_URL": tc.url, "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "true"}))
			resp := p.should(t, "shared", configtest.Desc("k="+tc.name))
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != 39 {
				t.Fatalf("first call: %v, want OK with 39 remaining", resp)
			}
			rdb := goredis.NewClient(&goredis.Options{Addr: s.Addr, Password: pw, DB: tc.db})
			defer rdb.Close()
			keys, err := rdb.Keys(context.Background(), "*"+tc.name+"*").Result()
			if err != nil || len(keys) != 1 {
				t.Errorf("database %d holds %v (%v), want the call's counter", tc.db, keys, err)
			}
			hc, err := http.Get("http://" + p.httpAddr + "/healthcheck")
			if err != nil {
				t.Fatal(err)
			}
			if body := readBody(hc); hc.StatusCode != http.StatusOK || strings.Contains(body, pw) {
				t.Errorf("/healthcheck: %d %q, want 200 without the password", hc.StatusCode, body)
			}
			p.stop(t)
			log := p.stderr.String()
			if strings.Contains(log, pw) {
				t.Errorf("the log shows the password:\n%s", log)
			}
			if !strings.Contains(log, "127.0.0.1:"+port) {
				t.Errorf("the log does not say which Redis:\n%s", log)
			}
		})
	}
}

// TestRedisURLErrors: an address that can never be dialed stops start-up
// with an error naming the variable (not a healthy service answering
// every decision Unavailable), without the password.
func TestRedisURLErrors(t *testing.T) {
	const pw = "url-s3cret-pw"
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"REDIS_URL": "redis://:" + pw + "@127.0.0.1:notaport/2"}, "REDIS_URL"},
		{map[string]string{"REDIS_URL": "redis://:" + pw + "@127.0.0.1:6379/db2"}, `database "db2" is not a number`},
		{map[string]string{"REDIS_URL": "127.0.0.1:6379:1", "REDIS_SOCKET_TYPE": "tcp"}, "too many colons"},
		{map[string]string{"REDIS_URL": "http://127.0.0.1:6379"}, `unknown scheme "http"`},
		{map[string]string{"REDIS_URL": "redis://127.0.0.1:1/2,redis://127.0.0.1:2/2", "REDIS_TYPE": "cluster"}, "database 0 only"},
		{map[string]string{"REDIS_URL": "redis://:" + pw + "@127.0.0.1:1", "REDIS_SOCKET_TYPE": "unix"}, "socket type is unix"},
		{map[string]string{"BACKEND_TYPE": "redis", "REDIS_PERSECOND": "true", "REDIS_URL": "127.0.0.1:1",
			"REDIS_PERSECOND_URL": "redis://:" + pw + "@127.0.0.1:x"}, "REDIS_PERSECOND_URL"},
	}
	for _, tc := range tests {
		code, out := runToExit(t, redisEnv(t, tc.env))
		if code == 0 || !strings.Contains(out, tc.want) || strings.Contains(out, pw) {
			t.Errorf("%v: exit %d, output\n%s\nwant a failure naming %q, without the password", tc.env, code, out, tc.want)
		}
	}
}

// TestRedisURLTLS: a rediss:// URL speaks TLS with the REDIS_TLS_* files,
// without REDIS_TLS=true, to a Redis that speaks only TLS and requires a
// client certificate.
func TestRedisURLTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "redis-ca")
	sc, sk := ca.Issue(t, "redis")
	cc, ck := ca.Issue(t, "ratelimit")
	caFile := tlstest.Write(t, dir, "ca.pem", ca.PEM)
	certFile, keyFile := tlstest.Write(t, dir, "client.pem", cc), tlstest.Write(t, dir, "client.key", ck)
	inspect, err := redis.TLSConfig(caFile, certFile, keyFile, false)
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.StartTLS(t, tlstest.Write(t, dir, "server.pem", sc), tlstest.Write(t, dir, "server.key", sk), caFile, inspect,
		"--tls-auth-clients", "yes")
	p := start(t, redisEnv(t, map[string]string{"REDIS_URL": "rediss://" + srv.Addr + "/1",
		"REDIS_TLS_CACERT": caFile, "REDIS_TLS_CLIENT_CERT": certFile, "REDIS_TLS_CLIENT_KEY": keyFile}))
	for i := range 41 {
		resp := p.should(t, "shared", configtest.Desc("k=rediss"))
		if want := i < 40; (resp.GetOverallCode() == rlsv3.RateLimitResponse_OK) != want {
			t.Fatalf("call %d over rediss://: %v, want OK %v", i+1, resp, want)
		}
	}
	if keys, err := srv.Do("KEYS", "*"); err != nil || keys != "" {
		t.Errorf("database 0 holds %q (%v), want the counter in database 1", keys, err)
	}
}

// TestRedisUnreachableNamesTheSetting: a Redis that does not answer at
// start-up leaves the service serving (the reference's way), and its
// warning says what the health check will show and which variable to
// change.
func TestRedisUnreachableNamesTheSetting(t *testing.T) {
	p := start(t, redisEnv(t, map[string]string{"REDIS_URL": "127.0.0.1:1"}))
	log := p.stderr.String()
	for _, want := range []string{"redis is not reachable yet", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true", "set REDIS_URL"} {
		if !strings.Contains(log, want) {
			t.Errorf("the start-up log does not say %q:\n%s", want, log)
		}
	}
}
