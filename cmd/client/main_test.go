package main

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/reload"
	"github.com/openrls/ratelimit/src/service"
)

func startService(t *testing.T) string {
	t.Helper()
	h := reload.NewHolder(nil)
	if err := h.Install(func() (*config.Config, error) {
		return config.LoadFiles([]string{"../../examples/ratelimit-config.yaml"}, config.Options{})
	}); err != nil {
		t.Fatal(err)
	}
	mem := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
	t.Cleanup(mem.Close)
	log := logrus.New()
	log.SetOutput(io.Discard)
	svc, err := service.New(service.Options{Store: mem, Configs: h, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

func TestRun(t *testing.T) {
	addr := startService(t)
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
	}{
		{"ok", []string{"-addr", addr, "-domain", "example", "-descriptors", "generic_key=demo"}, 0,
			"OK\n  generic_key=demo: OK, limit 1/minute, remaining 0"},
		{"over limit", []string{"-addr", addr, "-domain", "example", "-descriptors", "generic_key=demo"}, 2, "OVER_LIMIT"},
		{"two descriptors, nested", []string{"-addr", addr, "-domain", "example", "-descriptors", "api_key=k1,path=/api/upload/x", "-descriptors", "nope=1"}, 0,
			"  api_key=k1,path=/api/upload/x: OK, limit 20/minute, remaining 19"},
		{"the reference client's -dial_string", []string{"-dial_string", addr, "-domain", "example", "-descriptors", "remote_address=192.0.2.9"}, 0,
			"  remote_address=192.0.2.9: OK, limit 10/second"},
		// The check-then-report flow, and a refund: each descriptor's own
		// hits_addend, 0 for a check.
		{"a check counts nothing", []string{"-addr", addr, "-domain", "example", "-descriptors", "api_key=k7,path=/api/upload/x", "-hits", "0"}, 0,
			"  api_key=k7,path=/api/upload/x: OK, limit 20/minute, remaining 20"},
		{"usage of 5", []string{"-addr", addr, "-domain", "example", "-descriptors", "api_key=k7,path=/api/upload/x", "-hits", "5"}, 0,
			"remaining 15"},
		{"a refund of 3", []string{"-addr", addr, "-domain", "example", "-descriptors", "api_key=k7,path=/api/upload/x", "-hits", "3", "-refund"}, 0,
			"remaining 18"},
		{"bad descriptor", []string{"-addr", addr, "-domain", "example", "-descriptors", "novalue"}, 1, ""},
		{"missing domain", []string{"-addr", addr, "-descriptors", "a=b"}, 1, ""},
		{"help", []string{"-h"}, 0, "Usage:\n  client [-addr HOST:PORT] -domain DOMAIN"},
		{"--help", []string{"--help"}, 0, "-descriptors value"},
		{"version", []string{"-version"}, 0, "ratelimit "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(tc.args, &out, &errb); code != tc.wantCode || !strings.Contains(out.String(), tc.wantOut) {
				t.Errorf("run = %d, %q (stderr %q); want %d and %q", code, out.String(), errb.String(), tc.wantCode, tc.wantOut)
			}
		})
	}
}

// TestExplainAsksTheDebugPort: -explain sends the domain and descriptors
// to /explain and prints its answer; no RLS call is made.
func TestExplainAsksTheDebugPort(t *testing.T) {
	var got url.Values
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.URL.Query()
		_, _ = io.WriteString(w, "descriptors[0] a=1\n")
	}))
	defer srv.Close()
	var out, errb bytes.Buffer
	code := run([]string{"-explain", "-debug_addr", strings.TrimPrefix(srv.URL, "http://"), "-addr", "127.0.0.1:1",
		"-domain", "d", "-descriptors", "a=1", "-descriptors", "b=2,c=x y"}, &out, &errb)
	if code != 0 || out.String() != "descriptors[0] a=1\n" {
		t.Errorf("run = %d, %q (stderr %q)", code, out.String(), errb.String())
	}
	if got.Get("domain") != "d" || strings.Join(got["descriptor"], ";") != "a=1;b=2,c=x y" {
		t.Errorf("query = %v", got)
	}
}

// explainServer serves /explain from the example config as the service's
// debug port does (config.Explain), and counts its calls.
func explainServer(t *testing.T, calls *int) string {
	t.Helper()
	cfg, err := config.LoadFiles([]string{"../../examples/ratelimit-config.yaml"}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*calls++
		req, err := config.ParseRequest(r.URL.Query().Get("domain"), r.URL.Query()["descriptor"])
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		_, _ = io.WriteString(w, "# config version test\n")
		_ = cfg.Explain(w, time.Now(), req.Domain, req.Descriptors)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// An answer without a limit says why: an unknown domain, an unlimited
// rule and no rule read differently, from the service's /explain; a
// decided descriptor asks nothing; with the debug port away, the line
// says that no limit applied and how to learn why.
func TestClientSaysWhyNoLimitApplied(t *testing.T) {
	addr := startService(t)
	calls := 0
	debug := explainServer(t, &calls)
	for _, tc := range []struct {
		name      string
		args      []string
		want      string
		explained bool
	}{
		{"unknown domain", []string{"-domain", "nosuch", "-descriptors", "a=b"}, "  a=b: OK (unknown domain)\n", true},
		{"unlimited", []string{"-domain", "example", "-descriptors", "remote_address=127.0.0.1"}, "  remote_address=127.0.0.1: OK (unlimited)\n", true},
		{"no rule", []string{"-domain", "example", "-descriptors", "nope=1"}, "  nope=1: OK (no rule matches)\n", true},
		{"a limit: nothing asked", []string{"-domain", "example", "-descriptors", "remote_address=192.0.2.9"}, "OK, limit 10/second", false},
		{"the debug port away", []string{"-domain", "nosuch", "-descriptors", "a=b", "-debug_addr", "127.0.0.1:1"},
			"  a=b: OK (no limit applies: an unknown domain, no rule or an unlimited one; -explain says which)\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := calls
			args := append([]string{"-addr", addr, "-debug_addr", debug}, tc.args...)
			var out, errb bytes.Buffer
			if code := run(args, &out, &errb); code != 0 || !strings.Contains(out.String(), tc.want) {
				t.Errorf("run = %d, %q (stderr %q); want 0 and %q", code, out.String(), errb.String(), tc.want)
			}
			if asked := calls > before; asked != tc.explained {
				t.Errorf("asked /explain: %v, want %v", asked, tc.explained)
			}
		})
	}
}
