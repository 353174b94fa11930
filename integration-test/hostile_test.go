package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// memKB reads a line such as VmRSS or VmHWM (peak) of the server's
// /proc status, in KiB.
func memKB(t testing.TB, p *proc, field string) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + field + `:\s+(\d+) kB`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("no %s in /proc status", field)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// connected waits until c has its HTTP/2 connection. A test about what a
// flood does to connections that serve opens them first: on a machine busy
// with other work, a handshake that has to compete with the flood can take
// longer than the server's handshake bound (10 s), and that bound is not
// what such a test is about.
func connected(t *testing.T, c *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c.Connect()
	for s := c.GetState(); s != connectivity.Ready; s = c.GetState() {
		if !c.WaitForStateChange(ctx, s) {
			t.Fatalf("no gRPC connection within a minute: state %v", c.GetState())
		}
	}
}

// openConns opens n gRPC connections to p, each connected before it
// returns, closed when the test ends.
func openConns(t *testing.T, p *proc, n int) []*grpc.ClientConn {
	t.Helper()
	cs := make([]*grpc.ClientConn, n)
	for i := range cs {
		c, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		connected(t, c)
		cs[i] = c
	}
	return cs
}

// flood sends n concurrent requests, each with one value of size bytes,
// over conns connections, and returns the error codes seen.
func flood(t *testing.T, p *proc, n, conns, size int) map[codes.Code]int {
	t.Helper()
	cs := openConns(t, p, conns)
	big := strings.Repeat("v", size)
	var mu sync.Mutex
	got := map[codes.Code]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			_, err := rlsv3.NewRateLimitServiceClient(cs[i%conns]).ShouldRateLimit(ctx,
				&rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=" + big))})
			mu.Lock()
			if got[status.Code(err)]++; err != nil && got[status.Code(err)] == 1 {
				t.Logf("first %v: %v", status.Code(err), err)
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return got
}

// TestRequestFloodStaysBounded: 200 concurrent requests of 3 MB each are
// refused from their length prefix (REQUEST_MAX_BYTES) without being
// buffered, small requests keep being served meanwhile, and the peak
// resident memory stays far below what buffering them would take (600 MB).
func TestRequestFloodStaysBounded(t *testing.T) {
	p := start(t, writeConfig(t, map[string]string{"it.yaml": basicConfig}))
	before := memKB(t, p, "VmRSS")
	connected(t, p.conn)

	var served, failed atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // small requests during the flood
		defer close(done)
		for i := 0; i < 100_000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// A deadline far beyond the flood's own length: this asks
			// whether small requests are served, not how fast on a
			// machine that other work may be starving.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			_, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=small" + strconv.Itoa(i)))})
			cancel()
			if err != nil {
				if failed.Add(1) == 1 {
					t.Logf("first small request failed: %v", err)
				}
			} else {
				served.Add(1)
			}
		}
	}()
	got := flood(t, p, 200, 4, 3<<20)
	close(stop)
	<-done
	defer func() {
		if t.Failed() {
			t.Logf("server log:\n%s", p.stderr)
		}
	}()
	peak := memKB(t, p, "VmHWM")
	t.Logf("3 MB x 200 concurrent: codes %v; RSS %d MiB before, peak %d MiB; %d small requests served, %d failed, meanwhile",
		got, before>>10, peak>>10, served.Load(), failed.Load())
	if got[codes.ResourceExhausted] != 200 {
		t.Errorf("3 MB requests: codes %v, want all 200 ResourceExhausted", got)
	}
	if served.Load() == 0 || failed.Load() > 0 {
		t.Errorf("small requests during the flood: %d served, %d failed; want all served", served.Load(), failed.Load())
	}
	if peak > 256<<10 {
		t.Errorf("peak resident memory %d MiB during the flood, want under 256 MiB", peak>>10)
	}

	// Just under the bound: accepted and counted, memory bounded by the
	// concurrency times the bound.
	got = flood(t, p, 200, 4, 200<<10)
	peak = memKB(t, p, "VmHWM")
	t.Logf("200 KB x 200 concurrent: codes %v; peak RSS %d MiB", got, peak>>10)
	if got[codes.OK] != 200 {
		t.Errorf("200 KB requests: codes %v, want all OK", got)
	}
	if peak > 384<<10 {
		t.Errorf("peak resident memory %d MiB, want under 384 MiB", peak>>10)
	}
	if _, err := p.client().ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=after"))}); err != nil {
		t.Errorf("a small request after the floods: %v", err)
	}

	// Memory comes back once the process is quiet (src/memtrim looks every
	// 5 s); without it the high GOGC kept the spike resident for minutes.
	deadline := time.Now().Add(40 * time.Second)
	rss := memKB(t, p, "VmRSS")
	for rss > before+24<<10 && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond) // polling the process's own trimming
		rss = memKB(t, p, "VmRSS")
	}
	t.Logf("after the floods: RSS %d MiB (%d MiB before them)", rss>>10, before>>10)
	if rss > before+24<<10 {
		t.Errorf("RSS %d MiB 40 s after the floods, want back within 24 MiB of the %d MiB before them", rss>>10, before>>10)
	}
}

// TestSigtermWithStuckHTTPClientExitsZero: a client that sent half a
// request and went silent holds its connection through shutdown; after the
// grace the server closes it and still exits 0 (stop checks the code).
func TestSigtermWithStuckHTTPClientExitsZero(t *testing.T) {
	t.Parallel() // waits out the 10 s grace
	p := start(t, writeConfig(t, map[string]string{"it.yaml": basicConfig}))
	c, err := net.Dial("tcp", p.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "POST /json HTTP/1.1\r\nHost: rl\r\nContent-Length: 1000\r\n\r\n{\"domain\":"); err != nil {
		t.Fatal(err)
	}
	// The request is being read once the health check, served after it on
	// another connection, answers.
	waitHealth(t, p, 200)
	began := time.Now()
	p.stop(t)
	t.Logf("SIGTERM to exit with a stuck client: %v", time.Since(began).Round(time.Millisecond))
	if !strings.Contains(p.stderr.String(), "shutdown grace") {
		t.Errorf("the log does not say that connections were closed after the grace:\n%s", p.stderr)
	}
}

// TestSilentConnectionsAreClosed: a TCP connection to the gRPC port that
// never sends the HTTP/2 preface is closed after the handshake timeout
// (10 s), not kept for grpc-go's default of 120 s.
func TestSilentConnectionsAreClosed(t *testing.T) {
	t.Parallel() // waits out the 10 s handshake timeout
	p := start(t, writeConfig(t, map[string]string{"it.yaml": basicConfig}))
	c, err := net.Dial("tcp", p.grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	began := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
	_, err = io.Copy(io.Discard, c) // the server's settings frame, then EOF
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("a silent connection is still open after 60 s")
	}
	t.Logf("silent gRPC connection closed after %v (err %v)", time.Since(began).Round(time.Millisecond), err)
}

// TestStatsdNamesFromHostileValues drives the binary with statsd on and a
// detailed rule: a request value made of statsd syntax arrives as part of
// one name, never as a line or field of its own.
func TestStatsdNamesFromHostileValues(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	env := writeConfig(t, map[string]string{"it.yaml": `
domain: it
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 5}
`})
	env["USE_STATSD"] = "true"
	env["STATSD_PROTOCOL"] = "udp"
	env["STATSD_HOST"] = "127.0.0.1"
	env["STATSD_PORT"] = strconv.Itoa(pc.LocalAddr().(*net.UDPAddr).Port)
	env["STATSD_FLUSH_INTERVAL"] = "100ms"
	p := start(t, env)
	const evil = "evil:5|c\nratelimit.injected:999999|c"
	p.should(t, "it", configtest.Desc("user="+evil))

	_ = pc.SetReadDeadline(time.Now().Add(15 * time.Second))
	buf := make([]byte, 64<<10)
	var ruleLines []string
	for len(ruleLines) == 0 {
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatalf("no per-rule statsd line within 15 s: %v", err)
		}
		for _, line := range strings.Split(string(buf[:n]), "\n") {
			name, rest, ok := strings.Cut(line, ":")
			if !ok || !regexp.MustCompile(`^(-?\d+\|c|\d+\|g|\d+(\.\d+)?\|ms)$`).MatchString(rest) {
				t.Errorf("statsd line %q is not NAME:N|c, NAME:N|g or NAME:T|ms", line)
			}
			if strings.Contains(name, "injected") && !strings.HasPrefix(name, "ratelimit.service.rate_limit.it.user_evil_5_c_ratelimit.injected_999999_c.") {
				t.Errorf("statsd line %q: the request value escaped its name", line)
			}
			if strings.HasPrefix(name, "ratelimit.service.rate_limit.") {
				ruleLines = append(ruleLines, line)
			}
		}
	}
	resp, err := http.Get("http://" + p.debugAddr + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(readBody(resp)), "\n") {
		if !regexp.MustCompile(`^[^\s:]+: \d+$|^cmdline: \[.*\]$|^memstats: \{.*\}$`).MatchString(line) {
			t.Errorf("/stats line %q is not NAME: N", line)
		}
	}
}

// TestDebugPortIsLoopbackByDefault: without DEBUG_HOST, pprof and the
// config are served on loopback only.
func TestDebugPortIsLoopbackByDefault(t *testing.T) {
	env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
	env["DEBUG_HOST"] = unset
	p := start(t, env)
	if !regexp.MustCompile(`listening for debug on 127\.0\.0\.1:\d+`).MatchString(p.stderr.String()) {
		t.Errorf("without DEBUG_HOST the debug port is not on loopback:\n%s", p.stderr)
	}
	resp, err := http.Get("http://" + p.debugAddr + "/rlconfig")
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(resp); resp.StatusCode != 200 {
		t.Errorf("/rlconfig on loopback: %d %s", resp.StatusCode, body)
	}
}

// TestStoreErrorsStayInTheLog: a client is told the store is unavailable,
// not the store's address or Redis's own words; the log has the detail.
func TestStoreErrorsStayInTheLog(t *testing.T) {
	secret := redistest.Start(t, "--requirepass", "s3cret")
	tests := []struct {
		name    string
		env     map[string]string
		private []string // what the client must not see, and the log must
	}{
		{"nothing listening", map[string]string{"REDIS_URL": "127.0.0.1:" + strconv.Itoa(freePorts(t, 1)[0])}, []string{"refused"}},
		{"wrong password", map[string]string{"REDIS_URL": secret.Addr, "REDIS_AUTH": "wrong"}, []string{"WRONGPASS"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.env["REDIS_TIMEOUT"] = "200ms"
			p := start(t, redisEnv(t, tc.env))
			_, err := p.client().ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "shared", Descriptors: descs(configtest.Desc("k=a"))})
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("error = %v, want Unavailable", err)
			}
			resp, herr := http.Post("http://"+p.httpAddr+"/json", "application/json",
				strings.NewReader(`{"domain":"shared","descriptors":[{"entries":[{"key":"k","value":"a"}]}]}`))
			if herr != nil {
				t.Fatal(herr)
			}
			body := readBody(resp)
			for _, s := range append(tc.private, "127.0.0.1", "dial") {
				if strings.Contains(status.Convert(err).Message(), s) || strings.Contains(body, s) {
					t.Errorf("clients see %q: gRPC %q, POST /json %d %q", s, status.Convert(err).Message(), resp.StatusCode, body)
				}
			}
			for _, s := range tc.private {
				if !strings.Contains(p.stderr.String(), s) {
					t.Errorf("the log lacks the cause %q:\n%s", s, p.stderr)
				}
			}
		})
	}
}

// TestMemoryFullKeepsLimits: a full embedded store never frees a live
// counter for a new one: clients at their limit stay limited however many
// new values arrive; the new values are answered by the failure policy
// (Unavailable by default, OK with BACKEND_FAILURE_POLICY=allow), counted
// on /metrics and logged, as docs/stores.md says.
func TestMemoryFullKeepsLimits(t *testing.T) {
	for _, tc := range []struct {
		policy string
		want   codes.Code
	}{{unset, codes.Unavailable}, {"allow", codes.OK}} {
		t.Run("BACKEND_FAILURE_POLICY="+strings.Trim(tc.policy, "\x00"), func(t *testing.T) {
			env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
			// 20 per shard: the 200 clients' keys fit whatever the
			// process's hash seed (a shard past 20 of them: about 1 in
			// 10^9; at 10 per shard it was 1 run in 45), and the churn
			// fills every shard.
			env["MEMORY_MAX_KEYS"] = "1280"
			env["BACKEND_FAILURE_POLICY"] = tc.policy
			p := start(t, env)
			ask := func(user string) (rlsv3.RateLimitResponse_Code, codes.Code) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				resp, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=" + user))})
				return resp.GetOverallCode(), status.Code(err)
			}
			// 200 clients spend their budget of 2.
			for c := range 200 {
				for range 2 {
					if _, code := ask("client" + strconv.Itoa(c)); code != codes.OK {
						t.Fatalf("client %d: %v", c, code)
					}
				}
			}
			refused, began := 0, time.Now()
			for i := range 5_000 {
				if _, code := ask("churn" + strconv.Itoa(i)); code == tc.want && code != codes.OK {
					refused++
				} else if code != codes.OK {
					t.Fatalf("new value %d: %v, want OK or %v", i, code, tc.want)
				}
			}
			for c := range 200 {
				if rl, code := ask("client" + strconv.Itoa(c)); code != codes.OK || rl != rlsv3.RateLimitResponse_OVER_LIMIT {
					t.Fatalf("client %d after the churn: %v %v, want OVER_LIMIT", c, rl, code)
				}
			}
			// A limited client adding a value the full store has no room
			// for is still refused by its own counter, not answered by the
			// failure policy.
			for c := range 200 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "it",
					Descriptors: descs(configtest.Desc("user=client"+strconv.Itoa(c)), configtest.Desc("user=fresh"+strconv.Itoa(c)))})
				cancel()
				if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
					t.Fatalf("client %d with a new value beside: %v %v, want OVER_LIMIT", c, resp.GetOverallCode(), err)
				}
			}
			if tc.want != codes.OK && refused == 0 {
				t.Error("no new value was refused by a full store")
			}
			m := regexp.MustCompile(`(?m)^ratelimit_memory_full_total\{store="main"\} (\d+)`).FindStringSubmatch(metricsBody(t, p))
			if m == nil {
				t.Fatal(`/metrics lacks ratelimit_memory_full_total{store="main"}`)
			}
			if n, _ := strconv.Atoi(m[1]); n == 0 {
				t.Error("ratelimit_memory_full_total = 0 after a full store refused new values")
			}
			// At most a line per 5 s burst, however many refusals.
			bursts := 2 + int(time.Since(began)/(5*time.Second))
			if n := strings.Count(p.stderr.String(), "new counters answered by failure policy"); n == 0 || n > bursts {
				t.Errorf("the full store was logged %d times, want at least once and at most %d:\n%s", n, bursts, p.stderr)
			}
		})
	}
}

// TestConcurrentStreamsPerConnectionAreCapped reads the server's HTTP/2
// SETTINGS: it announces GRPC_MAX_CONCURRENT_STREAMS (1000 by default), so
// one connection cannot hold an unbounded number of calls.
func TestConcurrentStreamsPerConnectionAreCapped(t *testing.T) {
	for _, tc := range []struct{ set, want string }{{unset, "1000"}, {"7", "7"}} {
		t.Run("GRPC_MAX_CONCURRENT_STREAMS="+strings.Trim(tc.set, "\x00"), func(t *testing.T) {
			env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
			env["GRPC_MAX_CONCURRENT_STREAMS"] = tc.set
			p := start(t, env)
			c, err := net.Dial("tcp", p.grpcAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
				t.Fatal(err)
			}
			fr := http2.NewFramer(c, c)
			if err := fr.WriteSettings(); err != nil {
				t.Fatal(err)
			}
			for {
				f, err := fr.ReadFrame()
				if err != nil {
					t.Fatalf("no SETTINGS from the server: %v", err)
				}
				sf, ok := f.(*http2.SettingsFrame)
				if !ok || sf.IsAck() {
					continue
				}
				v, ok := sf.Value(http2.SettingMaxConcurrentStreams)
				if got := strconv.FormatUint(uint64(v), 10); !ok || got != tc.want {
					t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS = %s (announced %v), want %s", got, ok, tc.want)
				}
				return
			}
		})
	}
}
