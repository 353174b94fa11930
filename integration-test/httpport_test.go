package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/openrls/ratelimit/src/config/configtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// openFDs counts the server's open file descriptors.
func openFDs(t *testing.T, p *proc) int {
	t.Helper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// TestHTTPPortFloodLeavesGRPCAndHealth: with the process limited to 2,048
// file descriptors, 4,000 keep-alive connections to the HTTP port (each
// makes a request, then idles) never exhaust them: the HTTP listener's cap
// is fitted to the limit and idle connections give way to new ones. A new
// gRPC connection and /healthcheck still answer (their latency is logged;
// the wait for them is generous, a busy machine being no failure).
func TestHTTPPortFloodLeavesGRPCAndHealth(t *testing.T) {
	env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
	env[nofile] = "2048"
	p := start(t, env)
	if !strings.Contains(p.stderr.String(), "HTTP_MAX_CONNECTIONS lowered from 1024 to 240") {
		t.Errorf("the start-up log does not say the HTTP cap was fitted to 2,048 descriptors:\n%s", p.stderr)
	}
	const flood = 4000
	var mu sync.Mutex
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < flood; i += 8 {
				c, err := net.DialTimeout("tcp", p.httpAddr, 5*time.Second)
				if err != nil {
					continue // the listener's backlog is full: the flood's loss, not the test's
				}
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := fmt.Fprintf(c, "GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n"); err == nil {
					// Read the status line: the connection is then idle.
					_, _ = bufio.NewReader(c).ReadString('\n')
				}
				mu.Lock()
				held = append(held, c)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if n := openFDs(t, p); n >= 2048 {
		t.Errorf("the server holds %d file descriptors of 2,048", n)
	}

	began := time.Now()
	conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "it",
		Descriptors: descs(configtest.Desc("user=after-flood"))}); err != nil {
		t.Errorf("a new gRPC connection after the flood: %v", err)
	}
	grpcTook := time.Since(began)
	began = time.Now()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get("http://" + p.httpAddr + "/healthcheck")
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("/healthcheck after the flood: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	t.Logf("after %d keep-alive connections: a new gRPC call answered in %v, /healthcheck in %v; the server holds %d descriptors",
		flood, grpcTook, time.Since(began), openFDs(t, p))
	if strings.Contains(p.stderr.String(), "too many open files") {
		t.Errorf("the server ran out of file descriptors:\n%s", tail(p.stderr.String(), 2000))
	}
	m := regexp.MustCompile(`ratelimit_http_connections_closed_total\{port="http",why="evicted_idle"\} (\d+)`).FindStringSubmatch(metricsBody(t, p))
	if n, _ := strconv.Atoi(m[1]); m == nil || n == 0 {
		t.Errorf("no idle connection was evicted: %v", m)
	}
}

// TestSlowJSONBodiesAreBounded: 500 connections from ten loopback
// addresses each sending a /json body slowly (half of a 200 KiB body, then
// nothing) hold at most 64 bodies in memory at once (8 per address at
// most); the others are answered 503 at once, and their connections
// closed. The server's peak resident memory stays under 150
// MiB (measured: see the log line), and a body announced past
// REQUEST_MAX_BYTES is answered 413 before it is sent.
func TestSlowJSONBodiesAreBounded(t *testing.T) {
	p := start(t, writeConfig(t, map[string]string{"it.yaml": basicConfig}))
	before := memKB(t, p, "VmHWM")
	const slow, size = 500, 200 << 10
	chunk := strings.Repeat("x", size/2)
	var mu sync.Mutex
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	codes := map[string]int{}
	var wg sync.WaitGroup
	for w := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < slow; i += 50 {
				from := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+i%10))}
				c, err := (&net.Dialer{LocalAddr: from, Timeout: 5 * time.Second}).Dial("tcp", p.httpAddr)
				if err != nil {
					continue
				}
				mu.Lock()
				held = append(held, c)
				mu.Unlock()
				_ = c.SetDeadline(time.Now().Add(20 * time.Second))
				fmt.Fprintf(c, "POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", size, chunk)
				// A refused body is answered at once; a body being read
				// is not answered until it ends (it never does).
				_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
				line, _ := bufio.NewReader(c).ReadString('\n')
				mu.Lock()
				codes[strings.TrimSpace(line)]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	peak := memKB(t, p, "VmHWM")
	t.Logf("500 slow 200 KiB bodies: answers %v; peak RSS %d KiB (before %d KiB)", codes, peak, before)
	if peak > 150<<10 {
		t.Errorf("peak RSS %d KiB with 500 slow bodies, want under 150 MiB", peak)
	}
	if codes["HTTP/1.1 503 Service Unavailable"] != slow-64 {
		t.Errorf("answers %v, want 64 bodies read and the other %d turned away with 503", codes, slow-64)
	}
	// A body announced past REQUEST_MAX_BYTES is refused before it is sent.
	c, err := net.DialTimeout("tcp", p.httpAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", 300<<10)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(resp); resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(body, "REQUEST_MAX_BYTES") {
		t.Errorf("a body past REQUEST_MAX_BYTES: %d %q, want 413 naming REQUEST_MAX_BYTES", resp.StatusCode, body)
	}
}

// TestSlowJSONBodiesFromOneAddress: slow /json bodies from one address take
// at most 8 of the 64 body slots; another address's /json still answers.
func TestSlowJSONBodiesFromOneAddress(t *testing.T) {
	p := start(t, writeConfig(t, map[string]string{"it.yaml": basicConfig}))
	const size = 200 << 10
	chunk := strings.Repeat("x", size/2)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	refused := 0
	for range 64 {
		c, err := from(2).Dial("tcp", p.httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		fmt.Fprintf(c, "POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", size, chunk)
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if line, _ := bufio.NewReader(c).ReadString('\n'); strings.HasPrefix(line, "HTTP/1.1 503") {
			refused++
		}
	}
	if refused != 64-8 {
		t.Errorf("64 slow bodies from one address: %d refused, want all but 8", refused)
	}
	client := &http.Client{Transport: &http.Transport{DialContext: from(3).DialContext}, Timeout: 10 * time.Second}
	resp, err := client.Post("http://"+p.httpAddr+"/json", "application/json",
		strings.NewReader(`{"domain":"it","descriptors":[{"entries":[{"key":"user","value":"other"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(resp); resp.StatusCode != http.StatusOK {
		t.Errorf("/json from another address: %d %s, want 200", resp.StatusCode, body)
	}
}

// TestSilentConnectionsGiveWay: connections that never send a byte, from
// five addresses up to the per-address cap, fill the HTTP port's cap; a
// new /healthcheck still answers (a silent connection gives way, as an
// idle one does), and a client's idle keep-alive connection made before
// the flood is kept (the silent ones give way first).
func TestSilentConnectionsGiveWay(t *testing.T) {
	env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
	env["HTTP_MAX_CONNECTIONS"], env["HTTP_MAX_CONNECTIONS_PER_ADDRESS"] = "40", "10"
	p := start(t, env)
	// A client with a keep-alive connection, idle once it has its answer.
	reused := false
	keepAlive := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: from(7).DialContext}}
	get := func(c *http.Client) (int, error) {
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.httpAddr+"/healthcheck", nil)
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		readBody(resp)
		return resp.StatusCode, nil
	}
	if code, err := get(keepAlive); err != nil || code != 200 {
		t.Fatalf("the keep-alive client's first call: %d %v", code, err)
	}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for round := range 3 { // redialled, as an attacker would
		for a := byte(2); a <= 6; a++ {
			for range 10 {
				c, err := from(a).Dial("tcp", p.httpAddr)
				if err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				held = append(held, c)
			}
		}
	}
	probe := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: from(8).DialContext}}
	for i := range 5 {
		if code, err := get(probe); err != nil || code != 200 {
			t.Errorf("probe %d on a port full of silent connections: %d %v, want 200", i, code, err)
		}
	}
	if code, err := get(keepAlive); err != nil || code != 200 || !reused {
		t.Errorf("the keep-alive client after the flood: %d %v, reused its connection %v; want 200 on the same connection", code, err, reused)
	}
}

// TestStalledRequestsGiveWay: connections that send a request's first
// bytes and then nothing, redialled as soon as one is closed, fill an HTTP
// port's cap; they count as silent (no request read yet), so they give
// way to new connections and health probes get through while the flood
// goes on, rather than wait for the 10 s header timeout, whose closes the
// redials would take.
func TestStalledRequestsGiveWay(t *testing.T) {
	env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
	env["HTTP_MAX_CONNECTIONS"], env["HTTP_MAX_CONNECTIONS_PER_ADDRESS"] = "40", "10"
	p := start(t, env)
	stop := make(chan struct{})
	var flood sync.WaitGroup
	var placed atomic.Int64 // places the flood has taken once
	for a := byte(2); a <= 5; a++ {
		for range 10 {
			flood.Add(1)
			go func() { // one place, held by stalled requests until stop (two minutes at most)
				defer flood.Done()
				first := true
				for end := time.Now().Add(2 * time.Minute); time.Now().Before(end); {
					c, err := from(a).Dial("tcp", p.httpAddr)
					if err != nil {
						continue
					}
					if _, err := io.WriteString(c, "GET /healthcheck HTTP/1.1\r\n"); err == nil && first {
						first = false
						placed.Add(1)
					}
					closed := make(chan struct{})
					go func() { _, _ = io.Copy(io.Discard, c); close(closed) }()
					select {
					case <-closed:
					case <-stop:
						c.Close()
						return
					}
					c.Close()
				}
			}()
		}
	}
	defer func() { close(stop); flood.Wait() }()
	probe := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: from(8).DialContext}}
	get := func() error {
		resp, err := probe.Get("http://" + p.httpAddr + "/healthcheck")
		if err != nil {
			return err
		}
		readBody(resp)
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	for end := time.Now().Add(time.Minute); placed.Load() < 40; {
		if time.Now().After(end) {
			t.Fatalf("the flood took %d places in a minute, want the cap's 40", placed.Load())
		}
		time.Sleep(10 * time.Millisecond) // polling the flood's start
	}
	// Polled: the first probe may still race the flood's first dials.
	for end := time.Now().Add(time.Minute); get() != nil; {
		if time.Now().After(end) {
			t.Fatal("no probe answered within a minute of the flood")
		}
		time.Sleep(100 * time.Millisecond) // polling the service
	}
	failed := 0
	for range 20 {
		if err := get(); err != nil {
			failed++
			t.Logf("probe during the flood: %v", err)
		}
	}
	if failed > 0 {
		t.Errorf("%d of 20 probes failed while stalled requests were redialled", failed)
	}
}

// from dials from loopback address 127.0.0.last: the service counts
// clients by address, and loopback has many.
func from(last byte) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, last)}, Timeout: 5 * time.Second}
}
