package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/openrls/ratelimit/src/config/configtest"
)

// attackerAddr is the address attackers dial from; well-behaved callers
// dial from 127.0.0.1.
var attackerAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}

// dialH2From is dialH2 from a local address of its own.
func dialH2From(t testing.TB, addr string, local net.Addr) (*h2, <-chan http2.Frame) {
	t.Helper()
	conn, err := (&net.Dialer{Timeout: 5 * time.Second, LocalAddr: local}).Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return h2Over(t, conn, addr)
}

// settled sends a PING and waits, up to a minute, for its ACK or the end
// of the connection: the server has then read every frame before it.
func settled(t *testing.T, c *h2, frames <-chan http2.Frame) (resets int, cut bool) {
	t.Helper()
	c.wmu.Lock()
	_ = c.fr.WritePing(false, [8]byte{'s', 'e', 't', 't', 'l', 'e', 'd'})
	c.wmu.Unlock()
	timeout := time.After(time.Minute)
	for {
		select {
		case f, ok := <-frames:
			if !ok {
				return resets, true
			}
			switch f := f.(type) {
			case *http2.PingFrame:
				if f.IsAck() {
					return resets, false
				}
			case *http2.RSTStreamFrame:
				resets++
			case *http2.GoAwayFrame:
				return resets, true
			}
		case <-timeout:
			t.Fatal("no PING ACK and no end of the connection within a minute")
		}
	}
}

// caller runs well-behaved calls on a connection of its own from
// 127.0.0.1 until stop closes (at most n), counting those that fail.
type caller struct {
	ok, failed atomic.Int64
	worst      atomic.Int64 // ns
}

func (c *caller) run(t *testing.T, p *proc, n int, stop <-chan struct{}) {
	conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Error(err)
		return
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	for range n {
		select {
		case <-stop:
			return
		default:
		}
		begin := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=neighbour"))})
		cancel()
		if err != nil {
			c.failed.Add(1)
			continue
		}
		c.ok.Add(1)
		if d := time.Since(begin).Nanoseconds(); d > c.worst.Load() {
			c.worst.Store(d)
		}
	}
}

// TestHeaderOnlyStreamsAreBounded: 20 connections from one address, each
// opening 500 ShouldRateLimit streams that send HEADERS and never a body,
// hold no more than the address's 1,000 pending streams (each a handler
// goroutine): the rest are refused with RST_STREAM as they come, the
// connections that keep opening them are cut, and those held are refused
// once their request is 10 s late. A caller from another address, on its
// own connection, is answered throughout. Before, every such stream held
// a goroutine and its state for as long as the client liked.
func TestHeaderOnlyStreamsAreBounded(t *testing.T) {
	p := start(t, writeConfig(t, map[string]string{"it.yaml": basicConfig}))
	p.should(t, "it", configtest.Desc("user=warm"))
	before := goroutines(t, p)
	base := memKB(t, p, "VmRSS")
	stop := make(chan struct{})
	var neighbour caller
	var wg sync.WaitGroup
	wg.Go(func() { neighbour.run(t, p, 100000, stop) })
	const conns, streams = 20, 500
	type attacker struct {
		c      *h2
		frames <-chan http2.Frame
	}
	var as []attacker
	for range conns {
		c, frames := dialH2From(t, p.grpcAddr, attackerAddr)
		as = append(as, attacker{c, frames})
	}
	for _, a := range as {
		a.c.wmu.Lock()
		for i := range uint32(streams) {
			if err := a.c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1 + 2*i, BlockFragment: a.c.hdrs, EndHeaders: true}); err != nil {
				break // cut
			}
		}
		a.c.wmu.Unlock()
	}
	refused, cut := 0, 0
	for _, a := range as {
		n, gone := settled(t, a.c, a.frames)
		refused += n
		if gone {
			cut++
		}
	}
	peak := goroutines(t, p)
	rss := memKB(t, p, "VmRSS")
	t.Logf("%d×%d header-only streams: %d RST_STREAMs read before the PINGs, %d connections cut; goroutines %d → %d; RSS %d → %d MB",
		conns, streams, refused, cut, before, peak, base>>10, rss>>10)
	if peak > before+1000+200 {
		t.Errorf("goroutines %d → %d with the attack held: want at most the address's 1,000 pending streams more", before, peak)
	}
	if refused+cut == 0 {
		t.Error("no stream refused and no connection cut")
	}
	// The held ones are refused once 10 s late (the sweeper's second
	// after): the process comes back to where it was.
	eventually(t, "the late streams refused, the goroutines back", func() bool { return goroutines(t, p) <= before+50 })
	close(stop)
	wg.Wait()
	m := metricsBody(t, p)
	for _, e := range []string{"pending_streams", "stalled_request"} {
		if metricValue(m, `ratelimit_grpc_guard_total{event="`+e+`"}`) < 1 {
			t.Errorf("no %s event:\n%s", e, grepLines(m, "ratelimit_grpc_guard_total"))
		}
	}
	t.Logf("the neighbour: %d calls answered, %d failed, slowest %v", neighbour.ok.Load(), neighbour.failed.Load(),
		time.Duration(neighbour.worst.Load()))
	if neighbour.failed.Load() > 0 || neighbour.ok.Load() == 0 {
		t.Errorf("a caller from another address: %d calls failed, %d answered; want none failed", neighbour.failed.Load(), neighbour.ok.Load())
	}
}

// TestUnfinishedHeaderBlocksAreCut: a HEADERS frame without END_HEADERS
// that starts an 8 MB header value, followed by CONTINUATIONs, has its
// connection cut (GOAWAY ENHANCE_YOUR_CALM) once the block passes 64 KiB,
// and one left unfinished is cut 10 s after it began; nothing else could
// use those connections meanwhile (HTTP/2 allows no other frame inside a
// block). Before, each held up to 16 MB with no deadline.
func TestUnfinishedHeaderBlocksAreCut(t *testing.T) {
	p := start(t, writeConfig(t, map[string]string{"it.yaml": basicConfig}))
	// A literal header field, new name "x", of a 16 MB value (HPACK
	// integer: 127, then 7 bits a byte).
	start := []byte{0x00, 0x01, 'x', 0x7f, 0x81, 0xff, 0xff, 0x03}
	chunk := make([]byte, 16<<10)
	const big = 20
	var wg sync.WaitGroup
	var cut atomic.Int64
	for range big {
		c, frames := dialH2From(t, p.grpcAddr, attackerAddr)
		// Settings exchanged first: an ACK inside the block would be a
		// protocol error of the test's own.
		settled(t, c, frames)
		wg.Go(func() {
			c.wmu.Lock()
			err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: append(append([]byte(nil), c.hdrs...), start...)})
			for i := 0; i < 64 && err == nil; i++ { // 1 MB at most
				err = c.fr.WriteContinuation(1, false, chunk)
			}
			c.wmu.Unlock()
			if code, ok := waitGoAway(frames); ok && code == http2.ErrCodeEnhanceYourCalm {
				cut.Add(1)
			}
		})
	}
	slow, slowFrames := dialH2From(t, p.grpcAddr, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 3)})
	settled(t, slow, slowFrames)
	slow.wmu.Lock()
	_ = slow.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: slow.hdrs})
	slow.wmu.Unlock()
	wg.Wait()
	if got := cut.Load(); got != big {
		t.Errorf("%d of %d connections past 64 KiB of header block were cut with GOAWAY ENHANCE_YOUR_CALM", got, big)
	}
	if code, ok := waitGoAway(slowFrames); !ok || code != http2.ErrCodeEnhanceYourCalm {
		t.Errorf("an unfinished header block: GOAWAY %v (%v), want ENHANCE_YOUR_CALM", code, ok)
	}
	m := metricsBody(t, p)
	if got := metricValue(m, `ratelimit_grpc_guard_total{event="header_block"}`); got != big+1 {
		t.Errorf("header_block events: %v, want %d", got, big+1)
	}
	if got := p.should(t, "it", configtest.Desc("user=after")).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("a caller after the attack: %v", got)
	}
}

// TestSlowBodiesLeaveEnvoysConnection: an attacker holding 4 connections
// × 67 streams × 250 KB bodies sent all but their last byte (just under
// the request-byte budget), beside an "Envoy": one connection carrying
// 100 callers of small requests and 10 of 20 KB. The attacker's address
// holds at most its share of the budget once the budget is over three
// quarters full; its streams past it are refused, its slow ones refused after 10 s,
// and Envoy's connection is never cut: every one of its calls is answered.
// Before, Envoy's connection was cut whenever the budget was full
// (request_budget_full), failing every call on it.
func TestSlowBodiesLeaveEnvoysConnection(t *testing.T) {
	p := start(t, writeConfig(t, map[string]string{"it.yaml": basicConfig}))
	stop := make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const conns, streams, declared = 4, 67, 250_000 // 63.9 MiB in all
	var total, full, refused atomic.Int64
	var attack sync.WaitGroup
	end := time.Now().Add(15 * time.Second)
	var first sync.WaitGroup
	for range conns {
		// One transport a connection: each holds its 67 streams, and
		// redials when cut.
		tr := &http.Transport{Protocols: new(http.Protocols), MaxConnsPerHost: 1, DialContext: (&net.Dialer{Timeout: 10 * time.Second,
			LocalAddr: attackerAddr}).DialContext}
		tr.Protocols.SetUnencryptedHTTP2(true)
		defer tr.CloseIdleConnections()
		for range streams {
			first.Add(1)
			attack.Go(func() {
				once := sync.OnceFunc(first.Done)
				defer once()
				// A stream refused or cut is opened again, until the
				// end: the budget is kept as full as the guard lets it.
				for time.Now().Before(end) {
					done := make(chan struct{})
					body := &slowBody{declared: declared, stop: stop, total: &total, full: func() { full.Add(1); close(done) }}
					errc := sendSlow(ctx, tr, p.grpcAddr, body)
					select {
					case <-done:
						once()
						select { // held: until refused, or the end
						case <-errc:
							refused.Add(1)
						case <-stop:
							return
						}
					case <-errc:
						refused.Add(1)
						once()
						time.Sleep(10 * time.Millisecond)
					case <-ctx.Done():
						return
					}
				}
			})
		}
	}
	first.Wait() // every stream held or refused once
	// Envoy: one connection, 100 small callers and 10 of 20 KB, for the
	// 10 s after which the attacker's slow bodies are refused, and more.
	envoy, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer envoy.Close()
	client := rlsv3.NewRateLimitServiceClient(envoy)
	small := &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=envoy"))}
	large := &rlsv3.RateLimitRequest{Domain: "it"}
	for i := range 10 { // about 20 KB
		large.Descriptors = append(large.Descriptors, configtest.Desc(fmt.Sprintf("user=%d-%s", i, strings.Repeat("v", 2000))))
	}
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	var envoyCalls sync.WaitGroup
	for i := range 110 {
		req := small
		if i >= 100 {
			req = large
		}
		envoyCalls.Go(func() {
			for n := 0; n < 2000 && time.Now().Before(end); n++ {
				cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := client.ShouldRateLimit(cctx, req)
				ccancel()
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				} else {
					ok.Add(1)
				}
				time.Sleep(20 * time.Millisecond) // paced, as Envoy's callers are
			}
		})
	}
	envoyCalls.Wait()
	close(stop)
	cancel()
	attack.Wait()
	m := metricsBody(t, p)
	t.Logf("attacker: %d streams held, %d refused, %d MB sent; Envoy: %d answered, %d failed (first: %v); guard:\n%s", full.Load(),
		refused.Load(), total.Load()>>20, ok.Load(), failed.Load(), firstErr.Load(), grepLines(m, "ratelimit_grpc_guard_total"))
	if failed.Load() > 0 || ok.Load() == 0 {
		t.Errorf("Envoy's connection beside slow bodies: %d calls failed, %d answered; want none failed", failed.Load(), ok.Load())
	}
	if metricValue(m, `ratelimit_grpc_guard_total{event="request_bytes"}`)+
		metricValue(m, `ratelimit_grpc_guard_total{event="request_budget_full"}`)+
		metricValue(m, `ratelimit_grpc_guard_total{event="refused_streams"}`) < 1 {
		t.Error("no stream of the attacker's refused")
	}
}
