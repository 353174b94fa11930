package metrics

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"
)

// tcpCollector accepts statsd connections on loopback and hands over the
// lines it reads.
type tcpCollector struct {
	l     net.Listener
	lines chan string
}

func newTCPCollector(t *testing.T, addr string) *tcpCollector {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := &tcpCollector{l: l, lines: make(chan string, 1024)}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				sc := bufio.NewScanner(conn)
				for sc.Scan() {
					c.lines <- sc.Text()
				}
			}()
		}
	}()
	t.Cleanup(func() { l.Close() })
	return c
}

// next returns the next line the collector read.
func (c *tcpCollector) next(t *testing.T) string {
	t.Helper()
	select {
	case l := <-c.lines:
		return l
	case <-time.After(10 * time.Second):
		t.Fatal("the collector received nothing")
		return ""
	}
}

// TestStatsdTCPReconnects: over TCP (the reference's transport), counts
// made while the collector is down are not lost but sent, as one delta,
// once it listens again; response times go out as the reference's timer;
// an outage is reported once, not per flush, and the recovery once.
func TestStatsdTCPReconnects(t *testing.T) {
	// A port nobody listens on yet.
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()

	r := New(Options{})
	q := &timingQueue{c: make(chan time.Duration, 4)}
	r.addTimings(q)
	var errs, recovered int
	lines := &statsdLines{o: StatsdOptions{Network: "tcp", Addr: addr}}
	defer lines.close()
	sk := newFlusher(lines, q, func(error) { errs++ }, func() { recovered++ })
	rule := r.Rule("d", "k", false, "k")
	r.Hit(rule, Decision{Hits: 2, Used: 2, Limit: 10, Allowed: true})
	r.Request("ok", time.Millisecond) // a response time, lost with the failed write
	sk.flush(r, true)
	r.Hit(rule, Decision{Hits: 3, Used: 5, Limit: 10, Allowed: true})
	sk.flush(r, true)
	if errs != 1 {
		t.Fatalf("two failed flushes reported %d times, want once", errs)
	}
	if got := r.StatsdDropped(); got != 1 {
		t.Errorf("StatsdDropped() = %d after a failed write of one response time, want 1", got)
	}

	c := newTCPCollector(t, addr)
	r.Request("ok", 1500*time.Microsecond)
	sk.flush(r, true)
	if recovered != 1 {
		t.Errorf("recovery reported %d times, want once", recovered)
	}
	got := map[string]bool{}
	for len(got) < 4 {
		got[c.next(t)] = true
	}
	for _, want := range []string{
		"ratelimit_server.ShouldRateLimit.response_time:1.5|ms",
		"ratelimit.service.rate_limit.d.k.total_hits:5|c",
		"ratelimit.service.rate_limit.d.k.within_limit:5|c",
		"ratelimit_server.ShouldRateLimit.total_requests:2|c", // the first one's count waited for the collector
	} {
		if !got[want] {
			t.Errorf("the collector did not get %q; got %v", want, got)
		}
	}
}

// TestStatsdTimingsNeverBlock: response times past the buffer are dropped
// and counted; recording one never waits for the collector.
func TestStatsdTimingsNeverBlock(t *testing.T) {
	r := New(Options{})
	r.addTimings(&timingQueue{c: make(chan time.Duration, 2)})
	for range 5 {
		r.Request("ok", time.Millisecond)
	}
	if got := r.StatsdDropped(); got != 3 {
		t.Errorf("dropped %d response times, want 3 past a buffer of 2", got)
	}
}

// TestStatsdBadNetwork: an unknown network is an error, not a silent UDP.
func TestStatsdBadNetwork(t *testing.T) {
	err := New(Options{}).RunStatsd(t.Context(), StatsdOptions{Network: "quic", Addr: "127.0.0.1:1"})
	if err == nil || !strings.Contains(err.Error(), "quic") {
		t.Errorf("RunStatsd(quic) = %v", err)
	}
}
