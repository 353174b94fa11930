package integration

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/openrls/ratelimit/src/config/configtest"
)

// slowBody is a gRPC request body that declares a message of declared
// bytes and sends all of it but the last byte, then waits for stop: the
// shape of a client that holds the server's memory with partial bodies.
type slowBody struct {
	declared, sent int
	stop           <-chan struct{}
	total          *atomic.Int64 // bytes of every slow body read by the transport
	full           func()        // called once all but the last byte went
	once           sync.Once
}

func (b *slowBody) Read(p []byte) (int, error) {
	want := 5 + b.declared - 1
	if b.sent >= want {
		b.once.Do(b.full)
		<-b.stop
		return 0, errors.New("stopped")
	}
	n := min(len(p), want-b.sent)
	for i := range p[:n] {
		p[i] = 0
		if off := b.sent + i; off >= 1 && off < 5 {
			var prefix [4]byte
			binary.BigEndian.PutUint32(prefix[:], uint32(b.declared))
			p[i] = prefix[off-1]
		}
	}
	b.sent += n
	b.total.Add(int64(n))
	return n, nil
}

// TestSlowPartialBodiesAreBounded: 3,000 streams from one address, each
// declaring a request of nearly REQUEST_MAX_BYTES and sending all of it but
// the last byte, then waiting, do not take the service's memory with them:
// a stream counts from its HEADERS (an address holds at most 1,000 whose
// request is not whole), the bytes of unfinished messages against the
// request-byte budget and an address's against a quarter of it, and
// streams past any of them are refused (RST_STREAM ENHANCE_YOUR_CALM:
// pending_streams, request_budget_full, request_bytes). Meanwhile a caller
// from another address is answered, every call. Unguarded,
// the service held about 280 KB a stream (835 MB for 3,000).
func TestSlowPartialBodiesAreBounded(t *testing.T) {
	p := start(t, writeConfig(t, map[string]string{"it.yaml": basicConfig}))
	p.should(t, "it", configtest.Desc("user=legit")) // its connection, open before the attack
	base := memKB(t, p, "VmHWM")
	quiet, _ := latencies(t, p, 300, nil)
	type timed struct {
		ds     []time.Duration
		failed int
	}
	during := make(chan timed, 1)

	stop := make(chan struct{})
	// HTTP/2 without TLS, as gRPC speaks it on the port, from an address
	// of its own: the well-behaved caller's is 127.0.0.1.
	tr := &http.Transport{Protocols: new(http.Protocols), DialContext: (&net.Dialer{Timeout: 10 * time.Second,
		LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	const streams, declared = 3000, 254 << 10
	var total atomic.Int64
	var full, failed atomic.Int64
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	attacking := make(chan struct{})
	go func() {
		ds, failed := latencies(t, p, 300, attacking)
		during <- timed{ds, failed}
	}()
	for range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan struct{})
			body := &slowBody{declared: declared, stop: stop, total: &total, full: func() { full.Add(1); close(done) }}
			errc := sendSlow(ctx, tr, p.grpcAddr, body)
			select {
			case <-done: // held: the server keeps the stream open
			case <-errc: // cut, or answered before the body was whole
				failed.Add(1)
			case <-ctx.Done():
			}
		}()
	}
	wg.Wait() // every stream is held or failed, or 3 minutes passed
	peak := memKB(t, p, "VmHWM")
	close(attacking)
	d := <-during
	held, heldFailed := latencies(t, p, 300, nil)
	if d.failed+heldFailed > 0 {
		t.Errorf("a well-behaved caller on an address of its own: %d calls failed while the streams were sent, %d while held",
			d.failed, heldFailed)
	}
	// A caller on its own connection is served while the streams are held.
	if got := p.should(t, "it", configtest.Desc("user=legit")).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("a well-behaved caller during the attack: %v", got)
	}
	// The guard refused to hold them all: streams were refused past the
	// address's pending streams, or when their bodies would pass the
	// budget or their address's share (unit-tested in h2guard, where the
	// client's pace is the test's).
	m := metricsBody(t, p)
	if refused := metricValue(m, `ratelimit_grpc_guard_total{event="pending_streams"}`) +
		metricValue(m, `ratelimit_grpc_guard_total{event="request_budget_full"}`) +
		metricValue(m, `ratelimit_grpc_guard_total{event="request_bytes"}`); refused < 1 {
		t.Errorf("no stream refused for its unfinished body:\n%s", grepLines(m, "ratelimit_grpc_guard_total"))
	}
	close(stop)
	cancel()
	t.Logf("%d streams: %d held, %d cut; %d MB sent; peak RSS %d MB (%d before); a caller's p50/p99 %v/%v quiet, %v/%v in %d calls while they were sent, %v/%v while held",
		streams, full.Load(), failed.Load(), total.Load()>>20, peak>>10, base>>10, quantile(quiet, 0.5), quantile(quiet, 0.99),
		quantile(d.ds, 0.5), quantile(d.ds, 0.99), len(d.ds), quantile(held, 0.5), quantile(held, 0.99))
	if peak-base > 200<<10 {
		t.Errorf("peak RSS rose by %d MB with %d partial bodies held, want under 200 MB", (peak-base)>>10, full.Load())
	}
}

// sendSlow sends body as a ShouldRateLimit request over tr to addr, in
// the background: the channel carries the round trip's error (nil once
// the server answered, its answer read).
func sendSlow(ctx context.Context, tr *http.Transport, addr string, body io.Reader) <-chan error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", body)
	req.Header.Set("content-type", "application/grpc")
	req.Header.Set("te", "trailers")
	errc := make(chan error, 1)
	go func() {
		resp, err := tr.RoundTrip(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		errc <- err
	}()
	return errc
}

// latencies times up to n calls of a well-behaved caller, one at a time
// on its own connection, until until closes (nil: all n); for the log,
// never asserted. A call that fails is counted in failed, not timed.
func latencies(t *testing.T, p *proc, n int, until <-chan struct{}) (out []time.Duration, failed int) {
	for range n {
		select {
		case <-until:
			return out, failed
		default:
		}
		begin := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=timed"))})
		cancel()
		if err != nil {
			failed++
			continue
		}
		out = append(out, time.Since(begin))
	}
	return out, failed
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}
