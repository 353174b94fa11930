// Package integration drives the built server binary the way a user runs it:
// environment variables, config files on disk, a gRPC client from
// go-control-plane and plain HTTP.
package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

var serverBin string

func TestMain(m *testing.M) {
	if callerMain() {
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "ratelimit-it-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	serverBin = filepath.Join(dir, "server")
	// -trimpath as in the release build; it also keeps this machine's
	// paths out of the CPU profiles make pgo turns into release.pgo.
	// -buildvcs=auto as make build: the binary names its revision.
	build := exec.Command("go", "build", "-trimpath", "-buildvcs=auto", "-o", serverBin, "../cmd/server")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build server:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is one running server.
type proc struct {
	cmd                *exec.Cmd
	grpcAddr, httpAddr string
	debugAddr          string
	stderr             *syncBuffer
	exited             chan struct{}
	conn               *grpc.ClientConn
}

// freePorts returns n distinct free loopback ports. All n listeners stay open
// until every port is picked: closing each at once let the kernel hand the
// same port out twice.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// writeConfig writes files (name → YAML) into a fresh runtime tree and
// returns the env that points the server at it.
func writeConfig(t testing.TB, files map[string]string) map[string]string {
	t.Helper()
	root := t.TempDir()
	writeFiles(t, filepath.Join(root, "ratelimit", "config"), files)
	return map[string]string{"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_APPDIRECTORY": "config"}
}

// writeFiles writes files (name → content) into dir, creating it.
func writeFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// unset, as a value in a test's env, leaves that variable out of the
// server's environment (so its default applies).
const unset = "\x00unset"

// nofile, as a key in a test's env, runs the server with that limit on
// open files (RLIMIT_NOFILE, soft and hard), set by the shell that execs it.
const nofile = "\x00nofile"

// binaryKey, as a key in a test's env, runs that server binary instead of
// the one built for the tests (a benchmark comparing builds).
const binaryKey = "\x00binary"

// cpusKey, as a key in a test's env, runs the server on those CPUs only
// (taskset -c): a benchmark that gives the service a core of its own.
const cpusKey = "\x00cpus"

// command prepares the binary with env on free loopback ports.
func command(t testing.TB, env map[string]string) (*exec.Cmd, *proc) {
	t.Helper()
	p := &proc{stderr: &syncBuffer{}, exited: make(chan struct{})}
	ports := freePorts(t, 3)
	gp, hp, dp := ports[0], ports[1], ports[2]
	p.grpcAddr, p.httpAddr, p.debugAddr = "127.0.0.1:"+strconv.Itoa(gp), "127.0.0.1:"+strconv.Itoa(hp), "127.0.0.1:"+strconv.Itoa(dp)
	base := map[string]string{
		"PATH": os.Getenv("PATH"), "GRPC_HOST": "127.0.0.1", "HOST": "127.0.0.1", "DEBUG_HOST": "127.0.0.1",
		"GRPC_PORT": strconv.Itoa(gp), "PORT": strconv.Itoa(hp), "DEBUG_PORT": strconv.Itoa(dp), "LOG_LEVEL": "info",
	}
	for k, v := range env {
		base[k] = v
		if v == unset {
			delete(base, k)
		}
	}
	bin := serverBin
	if b, ok := base[binaryKey]; ok {
		delete(base, binaryKey)
		bin = b
	}
	cmd := exec.Command(bin)
	if cpus, ok := base[cpusKey]; ok {
		delete(base, cpusKey)
		cmd = exec.Command("taskset", "-c", cpus, bin)
	}
	if n, ok := base[nofile]; ok {
		delete(base, nofile)
		cmd = exec.Command("sh", "-c", "ulimit -n "+n+" && exec \"$0\"", bin)
	}
	for k, v := range base {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout = p.stderr
	cmd.Stderr = p.stderr
	p.cmd = cmd
	return cmd, p
}

// start runs the server and waits until /healthcheck answers 200.
func start(t testing.TB, env map[string]string) *proc {
	t.Helper()
	// Another test process (a redis-server of a parallel package, say) can
	// take a port between picking it and the server binding it; that start-up
	// failure says nothing about the server, so it gets fresh ports.
	const attempts = 3
	for i := 1; ; i++ {
		p, err := launch(t, env)
		if err == nil {
			return p
		}
		if i == attempts || !strings.Contains(p.stderr.String(), "address already in use") {
			t.Fatal(err)
		}
		t.Logf("attempt %d: %v; retrying on other ports", i, err)
	}
}

// launch runs the server once and waits until /healthcheck answers 200.
func launch(t testing.TB, env map[string]string) (*proc, error) {
	t.Helper()
	cmd, p := command(t, env)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() { p.stop(t) })
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + p.httpAddr + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case <-p.exited:
			return p, fmt.Errorf("server exited during start-up:\n%s", p.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not healthy within 20s:\n%s", p.stderr)
		}
		time.Sleep(20 * time.Millisecond) // readiness polling, not correctness
	}
	conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	p.conn = conn
	return p, nil
}

// stop sends SIGTERM and expects a clean exit.
func (p *proc) stop(t testing.TB) {
	if p.conn != nil {
		p.conn.Close()
	}
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		t.Errorf("server did not exit within 15s of SIGTERM:\n%s", p.stderr)
		return
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("server exit code after SIGTERM = %d, want 0:\n%s", code, p.stderr)
	}
}

// runToExit runs the binary expecting it to fail, returning code and output.
// exitsSaying runs the server with env and expects it to stop at
// start-up, its output saying want.
func exitsSaying(t testing.TB, env map[string]string, want string) {
	t.Helper()
	if code, out := runToExit(t, env); code == 0 || !strings.Contains(out, want) {
		t.Errorf("exit %d, output:\n%s\nwant a failure saying %q", code, out, want)
	}
}

func runToExit(t testing.TB, env map[string]string) (int, string) {
	t.Helper()
	cmd, p := command(t, env)
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("server still running after 20s, expected it to fail:\n%s", p.stderr)
	}
	return cmd.ProcessState.ExitCode(), p.stderr.String()
}

func (p *proc) client() rlsv3.RateLimitServiceClient { return rlsv3.NewRateLimitServiceClient(p.conn) }

func (p *proc) should(t testing.TB, domain string, descs ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: descs})
	if err != nil {
		t.Fatalf("ShouldRateLimit(%s): %v", domain, err)
	}
	return resp
}

func descs(ds ...*rlv3.RateLimitDescriptor) []*rlv3.RateLimitDescriptor { return ds }

// readBody reads and closes an HTTP response body.
func readBody(resp *http.Response) string {
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// syncBuffer is a bytes.Buffer that the child's output goroutine and the
// test may use at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// eventually polls cond until it holds, within a bounded wait.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 15s: %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling an eventually-consistent state
	}
}
