package integration

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/openrls/ratelimit/src/config/configtest"
	"google.golang.org/grpc"
)

func limitYAML(domain string, rpu int) string {
	return "domain: " + domain + "\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: " + strconv.Itoa(rpu) + "}\n"
}

// limitOf returns the requests_per_unit the server applies to domain/k, or
// 0 when nothing matches (unknown domain).
func limitOf(t *testing.T, p *proc, domain string) uint32 {
	t.Helper()
	return p.should(t, domain, configtest.Desc("k=v")).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
}

func waitLimit(t *testing.T, p *proc, domain string, want uint32) {
	t.Helper()
	eventually(t, domain+" served with limit "+strconv.Itoa(int(want)), func() bool { return limitOf(t, p, domain) == want })
}

func TestReloadInPlaceEditsBrokenFilesAndDomains(t *testing.T) {
	for _, watchRoot := range []string{"true", "false"} {
		t.Run("RUNTIME_WATCH_ROOT="+watchRoot, func(t *testing.T) {
			env := writeConfig(t, map[string]string{"a.yaml": limitYAML("a", 10)})
			env["RUNTIME_WATCH_ROOT"] = watchRoot
			dir := filepath.Join(env["RUNTIME_ROOT"], "ratelimit", "config")
			p := start(t, env)
			waitLimit(t, p, "a", 10)

			writeFiles(t, dir, map[string]string{"a.yaml": limitYAML("a", 20)})
			waitLimit(t, p, "a", 20)

			// A broken edit: the old config keeps serving, the error names the file and line.
			writeFiles(t, dir, map[string]string{"a.yaml": limitYAML("a", 30) + "  - key: k\n    rate_limit: {unit: fortnight}\n"})
			eventually(t, "the broken file's error logged", func() bool {
				return strings.Contains(p.stderr.String(), "a.yaml:6: descriptors[1].rate_limit.unit: unknown unit")
			})
			if got := limitOf(t, p, "a"); got != 20 {
				t.Errorf("after a broken edit: limit %d, want the last good 20", got)
			}
			writeFiles(t, dir, map[string]string{"a.yaml": limitYAML("a", 40)})
			waitLimit(t, p, "a", 40)

			writeFiles(t, dir, map[string]string{"b.yaml": limitYAML("b", 5)})
			waitLimit(t, p, "b", 5)
			if err := os.Remove(filepath.Join(dir, "b.yaml")); err != nil {
				t.Fatal(err)
			}
			waitLimit(t, p, "b", 0)
			waitLimit(t, p, "a", 40)
		})
	}
}

func TestReloadRootSymlinkSwap(t *testing.T) {
	base := t.TempDir()
	writeFiles(t, filepath.Join(base, "v1", "ratelimit", "config"), map[string]string{"a.yaml": limitYAML("a", 1)})
	writeFiles(t, filepath.Join(base, "v2", "ratelimit", "config"), map[string]string{"a.yaml": limitYAML("a", 2)})
	configtest.SwapLink(t, filepath.Join(base, "v1"), filepath.Join(base, "current"))
	p := start(t, map[string]string{"RUNTIME_ROOT": filepath.Join(base, "current"), "RUNTIME_SUBDIRECTORY": "ratelimit"})
	waitLimit(t, p, "a", 1)
	configtest.SwapLink(t, filepath.Join(base, "v2"), filepath.Join(base, "current"))
	waitLimit(t, p, "a", 2)
	configtest.SwapLink(t, filepath.Join(base, "v1"), filepath.Join(base, "current"))
	waitLimit(t, p, "a", 1)
}

func TestReloadConfigMapDataSwap(t *testing.T) {
	for _, watchRoot := range []string{"true", "false"} {
		t.Run("RUNTIME_WATCH_ROOT="+watchRoot, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "config")
			configtest.ConfigMap(t, dir, "..2026_11_22_01", map[string]string{"a.yaml": limitYAML("a", 7)})
			// RUNTIME_IGNOREDOTFILES stays false: the ..data internals must
			// still not be read twice (that would be a duplicate domain).
			p := start(t, map[string]string{"RUNTIME_ROOT": root, "RUNTIME_WATCH_ROOT": watchRoot})
			waitLimit(t, p, "a", 7)
			configtest.ConfigMap(t, dir, "..2026_11_22_02", map[string]string{"a.yaml": limitYAML("a", 8)})
			waitLimit(t, p, "a", 8)
			if strings.Contains(p.stderr.String(), "duplicate domain") {
				t.Errorf("ConfigMap internals read as a duplicate domain:\n%s", p.stderr)
			}
		})
	}
}

// xdsServer is go-control-plane's own xDS server and snapshot cache on a
// free loopback port, until the test ends.
type xdsServer struct {
	addr  string
	cache cachev3.SnapshotCache
}

func startXDS(t testing.TB, opts ...grpc.ServerOption) *xdsServer {
	t.Helper()
	x := &xdsServer{cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)}
	gs := grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, serverv3.NewServer(context.Background(), x.cache, nil))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	x.addr = lis.Addr().String()
	return x
}

// set serves cfgs to node as snapshot version.
func (x *xdsServer) set(t testing.TB, node, version string, cfgs ...*rlconfv3.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.cache.SetSnapshot(context.Background(), node, snap); err != nil {
		t.Fatal(err)
	}
}

func TestReloadFromXDS(t *testing.T) {
	x := startXDS(t)
	set := func(version string, rpu uint32) {
		x.set(t, "rl-node", version, &rlconfv3.RateLimitConfig{Name: "x", Domain: "x", Descriptors: []*rlconfv3.RateLimitDescriptor{{
			Key: "k", RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_HOUR, RequestsPerUnit: rpu}}}})
	}
	set("1", 11)
	p := start(t, map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": x.addr,
		"CONFIG_GRPC_XDS_NODE_ID": "rl-node", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "100ms"})
	waitLimit(t, p, "x", 11)
	set("2", 12)
	waitLimit(t, p, "x", 12)
}

// TestFIFOInConfigDirectory: a named pipe called *.yaml (nothing ever
// writes to it) neither blocks start-up nor wedges the watcher: it is
// skipped with a warning and later edits still reload.
func TestFIFOInConfigDirectory(t *testing.T) {
	env := writeConfig(t, map[string]string{"a.yaml": limitYAML("a", 10)})
	dir := filepath.Join(env["RUNTIME_ROOT"], "ratelimit", "config")
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := start(t, env)
	waitLimit(t, p, "a", 10)
	if !strings.Contains(p.stderr.String(), "pipe.yaml") {
		t.Errorf("no warning names the skipped pipe.yaml:\n%s", p.stderr)
	}

	if err := syscall.Mkfifo(filepath.Join(dir, "later.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeFiles(t, dir, map[string]string{"a.yaml": limitYAML("a", 20)})
	waitLimit(t, p, "a", 20)
	writeFiles(t, dir, map[string]string{"a.yaml": limitYAML("a", 30)})
	waitLimit(t, p, "a", 30)
}

// TestReloadThroughLinkedFile is make run's layout: the config directory
// holds a link to a file elsewhere; editing that file reloads.
func TestReloadThroughLinkedFile(t *testing.T) {
	root := t.TempDir()
	examples := filepath.Join(root, "examples")
	writeFiles(t, examples, map[string]string{"a.yaml": limitYAML("a", 10)})
	dir := filepath.Join(root, "run", "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(examples, "a.yaml"), filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	p := start(t, map[string]string{"RUNTIME_ROOT": filepath.Join(root, "run"), "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_APPDIRECTORY": "config"})
	waitLimit(t, p, "a", 10)
	writeFiles(t, examples, map[string]string{"a.yaml": limitYAML("a", 20)})
	waitLimit(t, p, "a", 20)
}

// TestConfigVersionIsVisible: the served config is named by a version (a
// hash of its rules) in /rlconfig's first line, with its load time, in
// ratelimit_config_info and in the reload log line; a reload that changes a
// rule changes it, one that only changes comments does not.
func TestConfigVersionIsVisible(t *testing.T) {
	env := writeConfig(t, map[string]string{"a.yaml": limitYAML("a", 10)})
	dir := filepath.Join(env["RUNTIME_ROOT"], "ratelimit", "config")
	p := start(t, env)
	header := regexp.MustCompile(`^# version ([0-9a-f]{16}), loaded (\S+)\n`)
	version := func() string {
		t.Helper()
		resp, err := http.Get("http://" + p.debugAddr + "/rlconfig")
		if err != nil {
			t.Fatal(err)
		}
		body := readBody(resp)
		m := header.FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("/rlconfig has no version line:\n%s", body)
		}
		if _, err := time.Parse(time.RFC3339, m[2]); err != nil {
			t.Errorf("load time %q: %v", m[2], err)
		}
		if !strings.Contains(metricsBody(t, p), `ratelimit_config_info{version="`+m[1]+`"} 1`) {
			t.Errorf("ratelimit_config_info does not name version %s", m[1])
		}
		return m[1]
	}
	v1 := version()
	writeFiles(t, dir, map[string]string{"a.yaml": "# only a comment changed\n" + limitYAML("a", 10)})
	eventually(t, "the comment-only edit reloaded", func() bool { return strings.Count(p.stderr.String(), "config loaded") >= 2 })
	if v := version(); v != v1 {
		t.Errorf("a comment changed the version: %s -> %s", v1, v)
	}
	writeFiles(t, dir, map[string]string{"a.yaml": limitYAML("a", 11)})
	waitLimit(t, p, "a", 11)
	v2 := version()
	if v2 == v1 {
		t.Errorf("a changed limit kept version %s", v1)
	}
	if !strings.Contains(p.stderr.String(), "version="+v2) {
		t.Errorf("no reload log line names version %s:\n%s", v2, p.stderr)
	}
}

// TestReloadErrorsOnePerLine: a reload that finds two broken files logs
// each error as its own entry, in text and JSON logs alike, never one
// line with a literal \n between them.
func TestReloadErrorsOnePerLine(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			env := writeConfig(t, map[string]string{"a.yaml": limitYAML("a", 10), "b.yaml": limitYAML("b", 10)})
			env["LOG_FORMAT"] = format
			dir := filepath.Join(env["RUNTIME_ROOT"], "ratelimit", "config")
			p := start(t, env)
			writeFiles(t, dir, map[string]string{
				"a.yaml": limitYAML("a", 10) + "  - key: k\n    rate_limit: {unit: fortnight}\n",
				"b.yaml": limitYAML("b", 10) + "  - key: k\n    rate_limit: {unit: eon}\n"})
			var lines []string
			eventually(t, "both files' errors logged", func() bool {
				lines = nil
				for _, l := range strings.Split(p.stderr.String(), "\n") {
					if strings.Contains(l, "the last good config keeps serving") {
						lines = append(lines, l)
					}
				}
				all := strings.Join(lines, "\n")
				return strings.Contains(all, "a.yaml:6:") && strings.Contains(all, "b.yaml:6:")
			})
			for _, l := range lines {
				if strings.Count(l, ".yaml:") != 1 || strings.Contains(l, `\n`) {
					t.Errorf("log entry %s: want one error in it", l)
				}
			}
		})
	}
}
