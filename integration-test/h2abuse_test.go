package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/openrls/ratelimit/src/config/configtest"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// h2 is a raw HTTP/2 client connection, for what no well-behaved client
// does.
type h2 struct {
	t    testing.TB
	conn net.Conn
	fr   *http2.Framer
	hdrs []byte // the header block of a ShouldRateLimit call
	// wmu serializes writes: the reader acknowledges settings while the
	// test writes, and a Framer's writes are not safe for concurrent use.
	wmu sync.Mutex
}

// dialH2 connects, sends the preface and settings, and returns the
// connection; frames arrive on the returned channel until it closes.
func dialH2(t testing.TB, addr string, settings ...http2.Setting) (*h2, <-chan http2.Frame) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return h2Over(t, conn, addr, settings...)
}

// dialH2TLS is dialH2 over TLS (HTTP/2 negotiated by ALPN).
func dialH2TLS(t testing.TB, addr string, cfg *tls.Config, settings ...http2.Setting) (*h2, <-chan http2.Frame) {
	t.Helper()
	c, frames, err := tryDialH2TLS(t, addr, cfg, settings...)
	if err != nil {
		t.Fatal(err)
	}
	return c, frames
}

// tryDialH2TLS is dialH2TLS returning the dial's error: a handshake left
// waiting in its address's line fails after 5 s.
func tryDialH2TLS(t testing.TB, addr string, cfg *tls.Config, settings ...http2.Setting) (*h2, <-chan http2.Frame, error) {
	cfg = cfg.Clone()
	cfg.NextProtos = []string{"h2"}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, nil, err
	}
	c, frames := h2Over(t, conn, addr, settings...)
	return c, frames, nil
}

// h2Over speaks HTTP/2 as a client on conn.
func h2Over(t testing.TB, conn net.Conn, addr string, settings ...http2.Setting) (*h2, <-chan http2.Frame) {
	t.Helper()
	t.Cleanup(func() { conn.Close() })
	// A write error (the server closed the connection at once) shows as
	// the frames channel closing.
	_, _ = io.WriteString(conn, http2.ClientPreface)
	fr := http2.NewFramer(conn, conn)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	_ = fr.WriteSettings(settings...)
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", addr},
		{":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	c := &h2{t: t, conn: conn, fr: fr, hdrs: block.Bytes()}
	frames := make(chan http2.Frame, 1024)
	go func() {
		defer close(frames)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
				c.wmu.Lock()
				_ = fr.WriteSettingsAck()
				c.wmu.Unlock()
			}
			select {
			case frames <- f:
			default: // the test reads what it needs; the rest may go
			}
		}
	}()
	return c, frames
}

// call opens stream id with a ShouldRateLimit request, whole.
func (c *h2) call(id uint32, req *rlsv3.RateLimitRequest) error {
	msg, err := proto.Marshal(req)
	if err != nil {
		c.t.Fatal(err)
	}
	body := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(body[1:5], uint32(len(msg)))
	copy(body[5:], msg)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hdrs, EndHeaders: true}); err != nil {
		return err
	}
	return c.fr.WriteData(id, true, body)
}

// reset cancels stream id.
func (c *h2) reset(id uint32) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.fr.WriteRSTStream(id, http2.ErrCodeCancel)
}

// goAway waits for the server's GOAWAY (or the end of the connection) and
// returns its error code; ok is false if the connection ended without one.
func goAway(t *testing.T, frames <-chan http2.Frame) (code http2.ErrCode, ok bool) {
	t.Helper()
	code, ok, timedOut := awaitGoAway(frames, 20*time.Second)
	if timedOut {
		t.Fatal("no GOAWAY within 20 s")
	}
	return code, ok
}

// waitGoAway is goAway for any goroutine, waiting up to a minute: ok is
// false if none came.
func waitGoAway(frames <-chan http2.Frame) (code http2.ErrCode, ok bool) {
	code, ok, _ = awaitGoAway(frames, time.Minute)
	return code, ok
}

// awaitGoAway waits up to limit for the server's GOAWAY or the end of the
// connection.
func awaitGoAway(frames <-chan http2.Frame, limit time.Duration) (code http2.ErrCode, ok, timedOut bool) {
	timeout := time.After(limit)
	for {
		select {
		case f, open := <-frames:
			if !open {
				return 0, false, false
			}
			if g, is := f.(*http2.GoAwayFrame); is {
				return g.ErrCode, true, false
			}
		case <-timeout:
			return 0, false, true
		}
	}
}

// rapidReset opens and cancels streams on c as fast as it can and expects
// the service's GOAWAY (ENHANCE_YOUR_CALM).
func rapidReset(t *testing.T, c *h2, frames <-chan http2.Frame) {
	t.Helper()
	req := &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=attacker"))}
	go func() {
		for i := uint32(0); i < 5000; i++ {
			id := 2*i + 1
			if c.call(id, req) != nil || c.reset(id) != nil {
				return // the server closed the connection
			}
		}
	}()
	if code, ok := goAway(t, frames); !ok || code != http2.ErrCodeEnhanceYourCalm {
		t.Errorf("rapid reset answered with GOAWAY %v (received: %v), want ENHANCE_YOUR_CALM", code, ok)
	}
}

// TestRapidResetIsCutOff: a connection that opens and cancels streams as
// fast as it can (HTTP/2 rapid reset) is answered GOAWAY
// (ENHANCE_YOUR_CALM) and closed, and the service keeps answering others.
func TestRapidResetIsCutOff(t *testing.T) {
	env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
	env["GRPC_ABUSE_COOLDOWN"] = "2s"
	p := start(t, env)
	p.should(t, "it", configtest.Desc("user=legit")) // a well-behaved client's connection, open before the attack
	c, frames := dialH2(t, p.grpcAddr)
	rapidReset(t, c, frames)
	if got := p.should(t, "it", configtest.Desc("user=legit")).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("a well-behaved client after the attack: %v", got)
	}
	// The attacker's address cools down, on probation: a well-behaved
	// client sharing it (behind one NAT) still gets a new connection
	// served (TestProbationLetsNeighboursIn: while the attack goes on).
	fresh, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := rlsv3.NewRateLimitServiceClient(fresh).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "it",
		Descriptors: descs(configtest.Desc("user=neighbour"))}); err != nil {
		t.Errorf("a new connection of a well-behaved client sharing the cooling address: %v", err)
	}
	m := metricsBody(t, p)
	for _, want := range []string{`ratelimit_grpc_guard_total{event="rapid_reset"} 1`} {
		if !bytes.Contains([]byte(m), []byte(want)) {
			t.Errorf("metrics lack %s:\n%s", want, m)
		}
	}
}

// TestProbationLetsNeighboursIn: an attacker that keeps redialling and
// resetting from an address keeps it cooling down, and each of its
// connections is cut; meanwhile a well-behaved client sharing the address
// (behind one NAT) opens new connections and every one of them is served:
// places on probation go in the order dials came, and stay with
// connections that do not reset, not with whoever dials most.
func TestProbationLetsNeighboursIn(t *testing.T) {
	p := start(t, writeConfig(t, map[string]string{"it.yaml": basicConfig}))
	stop := make(chan struct{})
	var attackers sync.WaitGroup
	// Six attackers, more than the places on probation: each redials and
	// resets until stopped, two minutes at most.
	for range 6 {
		attackers.Add(1)
		go attack(t, p, stop, attackers.Done)
	}
	defer func() { close(stop); attackers.Wait() }()
	waitMetric(t, p, `ratelimit_grpc_guard_total{event="rapid_reset"}`, 2)
	// Each cut, and each dial dropped from the line for a reset, renews
	// the address's cooldown.
	abuse := func(m string) float64 {
		return metricValue(m, `ratelimit_grpc_guard_total{event="rapid_reset"}`) + metricValue(m, `ratelimit_grpc_guard_total{event="reset_in_line"}`)
	}
	before := abuse(metricsBody(t, p))
	const neighbours = 10
	for i := range neighbours {
		c, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		// WaitForReady: a dial pushed out of a full line is closed, and
		// gRPC dials again, as Envoy does.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // gRPC waits a second or more between dials; a starved machine may need a few
		_, err = rlsv3.NewRateLimitServiceClient(c).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "it",
			Descriptors: descs(configtest.Desc("user=neighbour"))}, grpc.WaitForReady(true))
		cancel()
		c.Close()
		if err != nil {
			t.Fatalf("new connection %d of %d of a neighbour during the attack: %v\n%s", i+1, neighbours, err, metricsBody(t, p))
		}
	}
	// The attack went on while the neighbours connected (so the address
	// cooled down throughout), and its connections contended for the
	// places: more of them than places.
	m := metricsBody(t, p)
	if after := abuse(m); after <= before {
		t.Errorf("no abuse seen while the neighbours connected (%v before, %v after): the attack had stopped\n%s", before, after, m)
	}
	contended := metricValue(m, `ratelimit_grpc_guard_total{event="connection_held"}`) + metricValue(m, `ratelimit_grpc_guard_total{event="probation_replaced"}`)
	if contended < 1 {
		t.Errorf("no connection held in line or replaced on probation: the places were not contended\n%s", m)
	}
	event := func(e string) float64 { return metricValue(m, `ratelimit_grpc_guard_total{event="`+e+`"}`) }
	t.Logf("guard events: %v rapid resets, %v held, %v reset in line, %v replaced, %v refused", event("rapid_reset"),
		event("connection_held"), event("reset_in_line"), event("probation_replaced"), event("connection_refused"))
}

// attack redials and resets streams as fast as it can until stop closes,
// two minutes at most, then calls done.
func attack(t *testing.T, p *proc, stop <-chan struct{}, done func()) {
	defer done()
	req := &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=attacker"))}
	for end := time.Now().Add(2 * time.Minute); time.Now().Before(end); {
		select {
		case <-stop:
			return
		default:
		}
		conn, err := net.DialTimeout("tcp", p.grpcAddr, 5*time.Second)
		if err != nil {
			continue
		}
		// A connection held unanswered blocks writes once the socket
		// buffers fill; the attacker moves on.
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		c, _ := h2Over(t, conn, p.grpcAddr)
		for id := uint32(1); id < 2000 && c.call(id, req) == nil && c.reset(id) == nil; id += 2 {
		}
		conn.Close()
	}
}

// TestUnreadAnswersAreDropped: a client that advertises a zero window and
// so never lets an answer through holds its streams only until
// GRPC_STREAM_WRITE_TIMEOUT: then its connection is closed with GOAWAY and
// what it held is freed.
func TestUnreadAnswersAreDropped(t *testing.T) {
	env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
	env["GRPC_STREAM_WRITE_TIMEOUT"] = "2s"
	p := start(t, env)
	p.should(t, "it", configtest.Desc("user=legit")) // a well-behaved client's connection, open before the abuse
	c, frames := dialH2(t, p.grpcAddr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	for i := uint32(0); i < 50; i++ {
		if err := c.call(2*i+1, &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=" + strconv.Itoa(int(i))))}); err != nil {
			t.Fatal(err)
		}
	}
	if code, ok := goAway(t, frames); !ok || code != http2.ErrCodeEnhanceYourCalm {
		t.Errorf("a client that reads no answer: GOAWAY %v (received: %v), want ENHANCE_YOUR_CALM", code, ok)
	}
	if got := p.should(t, "it", configtest.Desc("user=legit")).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("a well-behaved client meanwhile: %v", got)
	}
}

// TestConnectionCap: past GRPC_MAX_CONNECTIONS (and so past
// GRPC_MAX_CONNECTIONS_PER_ADDRESS, loopback being one address) a new
// connection is closed at once; when one of the others goes, a new one is
// served again.
func TestConnectionCap(t *testing.T) {
	for _, cap := range []string{"GRPC_MAX_CONNECTIONS", "GRPC_MAX_CONNECTIONS_PER_ADDRESS"} {
		t.Run(cap, func(t *testing.T) { testConnectionCap(t, cap) })
	}
}

func testConnectionCap(t *testing.T, cap string) {
	env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
	env[cap] = "3"
	p := start(t, env)
	var held []*h2
	for range 3 {
		c, _ := dialH2(t, p.grpcAddr)
		held = append(held, c)
	}
	_, frames := dialH2(t, p.grpcAddr)
	if _, ok := goAway(t, frames); ok {
		t.Error("the fourth connection was served, want it closed at once")
	}
	held[0].conn.Close()
	eventually(t, "a connection is served once another went", func() bool {
		c, frames := dialH2(t, p.grpcAddr)
		if err := c.call(1, &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=x"))}); err != nil {
			return false
		}
		timeout := time.After(5 * time.Second)
		for {
			select {
			case f, open := <-frames:
				if !open {
					return false
				}
				if _, ok := f.(*http2.MetaHeadersFrame); ok {
					c.conn.Close()
					return true
				}
			case <-timeout:
				return false
			}
		}
	})
}

// TestIdleConnectionsAreClosed: a connection that carries no call for
// GRPC_MAX_CONNECTION_IDLE is sent GOAWAY and closed, so idle connections
// cannot pile up.
func TestIdleConnectionsAreClosed(t *testing.T) {
	env := writeConfig(t, map[string]string{"it.yaml": basicConfig})
	env["GRPC_MAX_CONNECTION_IDLE"] = "1s"
	p := start(t, env)
	_, frames := dialH2(t, p.grpcAddr)
	if code, ok := goAway(t, frames); !ok || code != http2.ErrCodeNo {
		t.Errorf("an idle connection: GOAWAY %v (received: %v), want NO_ERROR", code, ok)
	}
}

// metricValue is the value of the Prometheus series named exactly series
// in body (0 when absent).
func metricValue(body, series string) float64 {
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// waitMetric waits, a minute at most, until series reaches at least want.
func waitMetric(t *testing.T, p *proc, series string, want float64) {
	t.Helper()
	for end := time.Now().Add(time.Minute); ; {
		if metricValue(metricsBody(t, p), series) >= want {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s did not reach %v within a minute", series, want)
		}
		time.Sleep(100 * time.Millisecond) // polling the process's metrics
	}
}
