// Package h2guard guards a gRPC listener against one client taking it away
// from the others, below grpc-go: it caps connections (in all and per
// address), watches every connection's HTTP/2 frame headers (plaintext as
// accepted, TLS after the handshake) to cut rapid resets and connections
// whose answers are not read, puts an abusing address on probation, and
// bounds the calls in flight.
package h2guard

import (
	"context"
	"encoding/binary"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// grpc-go owns HTTP/2 on a connection, so what it cannot see coming is
// watched below it: Listener caps the connections, and every accepted
// connection is a guardedConn, which reads the frame headers going both ways
// (nine bytes a frame; payloads are skipped, never copied). With them it
// closes, with a GOAWAY of ENHANCE_YOUR_CALM written between two of
// grpc-go's frames:
//
//   - a rapid reset: more than ResetsPerSecond streams the client itself
//     reset within a second (CVE-2023-44487: each reset stream costs the
//     server a handler, the client nothing);
//   - a connection whose answers are not read: an answer whose headers went
//     out but whose message could not follow for StreamWriteTimeout. Only
//     the client's flow control holds a message back (headers are not
//     flow-controlled), so such a client is not reading, and every answer
//     it holds this way holds memory. A long-lived stream that does send
//     (a health Watch) is not held against it.
//
// Under TLS the bytes on the wire are encrypted, so the listener's
// connections only count toward the caps, and the frames are watched on the
// decrypted connection instead: creds hands grpc-go, after the
// handshake, the TLS connection wrapped in a guardedConn of its own (the
// handshake's AuthInfo, with the peer's certificate, goes through as it
// is).

// Options configure the guards; zero fields take Default's values.
type Options struct {
	// MaxConnections caps open gRPC connections; past it, a new one is
	// closed at once (GRPC_MAX_CONNECTIONS). MaxConnectionsPerAddress caps
	// those of one client address (GRPC_MAX_CONNECTIONS_PER_ADDRESS), so
	// that one host cannot hold them all.
	MaxConnections, MaxConnectionsPerAddress int
	// MaxInFlight caps ShouldRateLimit calls being handled at once across
	// all connections; past it, a call is answered ResourceExhausted at once
	// (GRPC_MAX_CALLS_IN_FLIGHT).
	MaxInFlight int
	// ResetsPerSecond is how many streams a client may reset in a second
	// before its connection is closed.
	ResetsPerSecond int
	// StreamWriteTimeout is how long a stream may stay open before its
	// connection is taken to be one whose answers are not read.
	StreamWriteTimeout time.Duration
	// Cooldown is how long an address is on probation after one of its
	// connections was closed for abuse (GRPC_ABUSE_COOLDOWN): an attacker
	// that simply redials would otherwise get a fresh budget each time. On
	// probation an address may hold probationConns new connections at once,
	// each closed after probationResets resets in a second, not
	// ResetsPerSecond; past them, a new one takes the place of one that
	// resets or holds its place unused, or is held unanswered until the
	// cooldown ends (see enterProbation). Well-behaved clients that share
	// the address (behind one NAT or load balancer) keep connecting, and
	// each connection an attacker gets costs it a handshake per
	// probationResets resets. Connections it already holds are not touched.
	Cooldown time.Duration
}

// Default fits a mesh: thousands of Envoy connections, each with far
// fewer resets than calls, every call answered within seconds.
var Default = Options{MaxConnections: 10000, MaxConnectionsPerAddress: 1000, MaxInFlight: 10000, ResetsPerSecond: 200, StreamWriteTimeout: 30 * time.Second,
	Cooldown: 10 * time.Second}

func (g Options) WithDefaults() Options {
	if g.MaxConnections <= 0 {
		g.MaxConnections = Default.MaxConnections
	}
	if g.MaxConnectionsPerAddress <= 0 {
		g.MaxConnectionsPerAddress = Default.MaxConnectionsPerAddress
	}
	if g.MaxInFlight <= 0 {
		g.MaxInFlight = Default.MaxInFlight
	}
	if g.ResetsPerSecond <= 0 {
		g.ResetsPerSecond = Default.ResetsPerSecond
	}
	if g.StreamWriteTimeout <= 0 {
		g.StreamWriteTimeout = Default.StreamWriteTimeout
	}
	if g.Cooldown < 0 {
		g.Cooldown = 0
	} else if g.Cooldown == 0 {
		g.Cooldown = Default.Cooldown
	}
	return g
}

// Event names why a guard acted, for metrics and logs.
type Event string

// The guards' events.
const (
	EventConnectionRefused Event = "connection_refused" // past MaxConnections
	EventCallRefused       Event = "call_refused"       // past MaxInFlight
	EventRapidReset        Event = "rapid_reset"        // closed: too many resets
	EventUnreadAnswers     Event = "unread_answers"     // closed: a stream outlived StreamWriteTimeout
	// closed: on probation, gave its place to a new connection of its address
	EventProbationReplaced Event = "probation_replaced"
)

// InFlightLimit is a unary interceptor that answers ResourceExhausted past
// max calls in flight, rather than letting them queue without bound.
func InFlightLimit(max int, note func(Event)) grpc.UnaryServerInterceptor {
	sem := make(chan struct{}, max)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		select {
		case sem <- struct{}{}:
		default:
			note(EventCallRefused)
			return nil, status.Errorf(codes.ResourceExhausted, "more than %d calls in flight (GRPC_MAX_CALLS_IN_FLIGHT)", max)
		}
		defer func() { <-sem }()
		return handler(ctx, req)
	}
}

// Listener caps a gRPC listener's connections and wraps each in a
// guardedConn.
type Listener struct {
	net.Listener
	o     Options
	note  func(Event)
	open  atomic.Int64
	watch bool     // parse frames of accepted connections: the listener carries plaintext HTTP/2
	conns sync.Map // the watched connections, for the sweeper
	// banned maps an address (IP) to when its cooldown ends (ns).
	banned sync.Map
	// perHost counts open connections by address (IP); held are those
	// of cooling addresses, kept in the tarpit.
	hostMu  sync.Mutex
	perHost map[string]int
	// probation holds, by address, the open connections admitted while
	// it cooled (at most probationConns each).
	probation map[string][]*guardedConn
	held      map[string][]net.Conn
	heldTotal int
	stop      chan struct{}
	once      sync.Once
	// now is the sweeper's clock (ns), a second coarse: stamping each
	// stream with it costs a load, not a clock read.
	now atomic.Int64
	// clock decides cooldowns and probation, and sets now: time.Now
	// (tests set another).
	clock func() time.Time
}

// NewListener wraps l: it caps the connections, and with watch (l carries
// plaintext HTTP/2) watches their frames; note hears each time a guard
// acts. Under TLS, pass watch false and hand grpc-go the credentials of
// Creds instead.
func NewListener(l net.Listener, o Options, watch bool, note func(Event)) *Listener {
	return newListener(l, o, watch, note, time.Now)
}

// newListener is NewListener on clock.
func newListener(l net.Listener, o Options, watch bool, note func(Event), clock func() time.Time) *Listener {
	gl := &Listener{Listener: l, o: o, note: note, watch: watch, stop: make(chan struct{}), perHost: map[string]int{},
		probation: map[string][]*guardedConn{}, held: map[string][]net.Conn{}, clock: clock}
	gl.now.Store(clock().UnixNano())
	go gl.sweep()
	return gl
}

func (gl *Listener) Accept() (net.Conn, error) {
	for {
		c, err := gl.Listener.Accept()
		if err != nil {
			return nil, err
		}
		host := Host(c.RemoteAddr())
		gc := &guardedConn{Conn: c, gl: gl, host: host, counted: true, probation: gl.cooling(c.RemoteAddr())}
		if gc.probation {
			admitted, evicted := gl.enterProbation(gc)
			if !admitted {
				gl.note(EventConnectionRefused)
				gl.tarpit(c)
				continue
			}
			if w := evicted; w != nil {
				// Under TLS the GOAWAY goes on the decrypted connection;
				// one still in its handshake is simply closed.
				if w = evicted.watcher.Load(); w != nil {
					w.goAway(EventProbationReplaced, false)
				} else {
					gl.note(EventProbationReplaced)
					_ = evicted.Close()
				}
			}
		}
		if !gl.admit(host) {
			if gc.probation {
				gl.leaveProbation(gc)
			}
			gl.note(EventConnectionRefused)
			_ = c.Close()
			continue
		}
		if gl.watch {
			gc.watcher.Store(gc)
			gl.startWatching(gc)
		}
		return gc, nil
	}
}

// tarpitPerHost and tarpitTotal bound the connections held per cooling
// address and in all; probationConns and probationResets bound what a
// cooling address's admitted connections may hold and reset (see
// Options.Cooldown). A connection on probation that reset a stream within
// suspectFor, or opened none within quietFor, gives its place to a new
// one.
const (
	tarpitPerHost   = 16
	tarpitTotal     = 1024
	probationConns  = 4
	probationResets = 10
	suspectFor      = 2 * time.Second
	quietFor        = 5 * time.Second
)

// tarpit holds a connection from a cooling address open, unread and
// unanswered, until its cooldown ends (up to tarpitPerHost of them; past
// that they are closed at once). Closed at once, an attacker redials in a
// tight loop, and each refusal costs this process an accept and a close;
// held, its dials wait, and cost nothing.
func (gl *Listener) tarpit(c net.Conn) {
	host := Host(c.RemoteAddr())
	gl.hostMu.Lock()
	if host == "" || len(gl.held[host]) >= tarpitPerHost || gl.heldTotal >= tarpitTotal {
		gl.hostMu.Unlock()
		_ = c.Close()
		return
	}
	gl.held[host] = append(gl.held[host], c)
	gl.heldTotal++
	gl.hostMu.Unlock()
}

// release the held connections of addresses no longer cooling (all, once
// the listener closes).
func (gl *Listener) releaseHeld(all bool) {
	gl.hostMu.Lock()
	defer gl.hostMu.Unlock()
	for host, conns := range gl.held {
		if _, cooling := gl.banned.Load(host); cooling && !all {
			continue
		}
		for _, c := range conns {
			_ = c.Close()
		}
		gl.heldTotal -= len(conns)
		delete(gl.held, host)
	}
}

// enterProbation admits gc, a new connection of a cooling address, while
// the address holds fewer than probationConns such connections. Past that
// it takes the place of one that behaves like an attacker's (a stream
// reset within suspectFor) or holds a place without using it (no stream
// within quietFor): that one is returned, to be closed. Otherwise gc is
// not admitted (held in the tarpit).
//
// An attacker behind an address shared with well-behaved clients redials
// all the time; a rate of admissions would go to its dials and leave a
// neighbour's new connection nothing. Places go instead to connections
// that use them as a client does, and an attacker gets at most
// probationResets resets for each connection it opens: a handshake per
// ten handlers.
func (gl *Listener) enterProbation(gc *guardedConn) (admitted bool, evicted *guardedConn) {
	gl.hostMu.Lock()
	defer gl.hostMu.Unlock()
	conns := gl.probation[gc.host]
	if len(conns) >= probationConns {
		now := gl.clock().UnixNano()
		i := slices.IndexFunc(conns, func(c *guardedConn) bool { return c.givesWay(now) })
		if i < 0 {
			return false, nil
		}
		evicted = conns[i]
		conns = slices.Delete(conns, i, i+1)
	}
	gc.admittedAt = gl.clock().UnixNano()
	gl.probation[gc.host] = append(conns, gc)
	return true, evicted
}

// leaveProbation forgets gc among its address's probation connections.
func (gl *Listener) leaveProbation(gc *guardedConn) {
	gl.hostMu.Lock()
	defer gl.hostMu.Unlock()
	conns := slices.DeleteFunc(gl.probation[gc.host], func(c *guardedConn) bool { return c == gc })
	if len(conns) == 0 {
		delete(gl.probation, gc.host)
		return
	}
	gl.probation[gc.host] = conns
}

// givesWay reports whether c, a connection on probation, gives its place
// to a new one at now (ns): it reset a stream within suspectFor, or opened
// none within quietFor (counted from its admission when it opened none).
func (c *guardedConn) givesWay(now int64) bool {
	w := c.watcher.Load()
	if w == nil { // a TLS handshake in progress
		return now-c.admittedAt >= int64(quietFor)
	}
	lastStream := max(w.lastStream.Load(), c.admittedAt)
	return now-w.lastReset.Load() < int64(suspectFor) || now-lastStream >= int64(quietFor)
}

// admit counts a new connection from host, or reports false if it would
// pass a cap.
func (gl *Listener) admit(host string) bool {
	gl.hostMu.Lock()
	defer gl.hostMu.Unlock()
	if gl.open.Load() >= int64(gl.o.MaxConnections) || host != "" && gl.perHost[host] >= gl.o.MaxConnectionsPerAddress {
		return false
	}
	gl.open.Add(1)
	if host != "" {
		gl.perHost[host]++
	}
	return true
}

// release uncounts a connection from host.
func (gl *Listener) release(host string) {
	gl.hostMu.Lock()
	defer gl.hostMu.Unlock()
	gl.open.Add(-1)
	if host != "" {
		if gl.perHost[host]--; gl.perHost[host] <= 0 {
			delete(gl.perHost, host)
		}
	}
}

// cooling reports whether addr's host is in its cooldown after an abuse.
func (gl *Listener) cooling(addr net.Addr) bool {
	host := Host(addr)
	until, ok := gl.banned.Load(host)
	if !ok {
		return false
	}
	if gl.clock().UnixNano() < until.(int64) {
		return true
	}
	gl.banned.Delete(host)
	return false
}

// ban starts addr's host's cooldown. Only TCP peers have one: the peers of
// a Unix socket (GRPC_UDS) share one empty address, and one of them must
// not shut the others out.
func (gl *Listener) ban(addr net.Addr) {
	if _, tcp := addr.(*net.TCPAddr); tcp && gl.o.Cooldown > 0 {
		gl.banned.Store(Host(addr), gl.clock().Add(gl.o.Cooldown).UnixNano())
	}
}

// Host is what the caps and probation count a peer by: a TCP peer's IP,
// or "" for a Unix socket's peer (the HTTP listeners count by it too).
func Host(addr net.Addr) string {
	if a, ok := addr.(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return ""
}

func (gl *Listener) Close() error {
	gl.once.Do(func() { close(gl.stop) })
	err := gl.Listener.Close()
	gl.releaseHeld(true)
	return err
}

// sweep closes, once a second, the connections holding a stream older than
// StreamWriteTimeout.
func (gl *Listener) sweep() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-gl.stop:
			return
		case <-t.C:
			now := gl.clock()
			gl.now.Store(now.UnixNano())
			gl.banned.Range(func(k, v any) bool {
				if v.(int64) <= now.UnixNano() {
					gl.banned.Delete(k)
				}
				return true
			})
			gl.releaseHeld(false)
			gl.conns.Range(func(k, _ any) bool {
				if c := k.(*guardedConn); c.oldestWaiting() < now.Add(-gl.o.StreamWriteTimeout).UnixNano() {
					c.goAway(EventUnreadAnswers, false)
				}
				return true
			})
		}
	}
}

// clientPreface is what an HTTP/2 client sends before its first frame.
const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// HTTP/2 frame types and flags the guard reads.
const (
	frameData     = 0x0
	frameHeaders  = 0x1
	frameRST      = 0x3
	frameGoAway   = 0x7
	flagEndStream = 0x1
	frameHeader   = 9
	errCalm       = 0xb // ENHANCE_YOUR_CALM
)

// frameReader follows frame boundaries in one direction of a connection.
type frameReader struct {
	preface int // preface bytes still to skip
	hdr     [frameHeader]byte
	have    int    // bytes of hdr read
	skip    uint32 // payload bytes of the current frame still to pass
}

// feed passes b through, calling frame for each complete frame header,
// and returns how many bytes it passed: all of them, unless frame returns
// true (stop), which ends the pass right after that frame's header.
func (f *frameReader) feed(b []byte, frame func(typ, flags byte, stream uint32) (stop bool)) int {
	total := len(b)
	for len(b) > 0 {
		switch {
		case f.preface > 0:
			n := min(f.preface, len(b))
			f.preface -= n
			b = b[n:]
		case f.skip > 0:
			n := min(int(f.skip), len(b))
			f.skip -= uint32(n)
			b = b[n:]
		default:
			n := copy(f.hdr[f.have:], b)
			f.have += n
			b = b[n:]
			if f.have == frameHeader {
				f.have = 0
				f.skip = uint32(f.hdr[0])<<16 | uint32(f.hdr[1])<<8 | uint32(f.hdr[2])
				if frame(f.hdr[3], f.hdr[4], binary.BigEndian.Uint32(f.hdr[5:9])&0x7fffffff) {
					return total - len(b)
				}
			}
		}
	}
	return total
}

// atBoundary reports whether the stream of frames is between two frames.
func (f *frameReader) atBoundary() bool { return f.preface == 0 && f.skip == 0 && f.have == 0 }

// startWatching makes gc parse its frames, and the sweeper look at it.
func (gl *Listener) startWatching(gc *guardedConn) {
	gc.watch, gc.waiting, gc.in = true, map[uint32]int64{}, frameReader{preface: len(clientPreface)}
	gc.done = make(chan struct{})
	gl.conns.Store(gc, struct{}{})
}

// Creds wraps TLS transport credentials so that the connections gl
// accepts are watched after the handshake, on their decrypted HTTP/2.
func (gl *Listener) Creds(tls credentials.TransportCredentials) credentials.TransportCredentials {
	return creds{TransportCredentials: tls, gl: gl}
}

// creds are TLS transport credentials whose connections are watched
// after the handshake, on their decrypted HTTP/2 (see the note above).
type creds struct {
	credentials.TransportCredentials
	gl *Listener
}

func (g creds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := g.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return nil, nil, err
	}
	// raw, a guardedConn of the listener, stays counted until conn closes
	// it; this one only watches.
	gc := &guardedConn{Conn: conn, gl: g.gl, host: Host(raw.RemoteAddr())}
	if r, ok := raw.(*guardedConn); ok {
		gc.probation = r.probation // its thresholds; raw counts it
		r.watcher.Store(gc)
	}
	g.gl.startWatching(gc)
	return gc, info, nil
}

func (g creds) Clone() credentials.TransportCredentials {
	return creds{TransportCredentials: g.TransportCredentials.Clone(), gl: g.gl}
}

// guardedConn is one gRPC connection as the guards see it: counted toward
// the caps (counted: it was accepted by the listener), and, when watch is
// set, with its frames watched; see the package note above.
type guardedConn struct {
	net.Conn
	gl        *Listener
	host      string // the client's address (IP); empty for a Unix socket
	counted   bool
	watch     bool
	probation bool // admitted while its address cooled down
	// admittedAt is when a probation connection was admitted (ns, the
	// listener's clock); watcher is the connection whose frames are
	// watched: itself in plaintext, the decrypted one under TLS (nil until
	// the handshake ends). On the watched one, lastReset and lastStream are
	// when the client last reset and opened a stream (ns, the clock).
	admittedAt            int64
	watcher               atomic.Pointer[guardedConn]
	lastReset, lastStream atomic.Int64
	closed                atomic.Bool
	done                  chan struct{} // closed by Close (watched connections)

	in frameReader // the client's frames; touched by grpc-go's reader only

	// wmu orders the socket writes (grpc-go's and a GOAWAY): only a
	// writer holds it, while its write may block on a peer that does not
	// read. mu guards the state below and is never held across a socket
	// write, so the sweeper and the read path never wait on a peer.
	wmu     sync.Mutex
	mu      sync.Mutex
	out     frameReader      // the server's frames, as written
	waiting map[uint32]int64 // streams whose answer's headers went out, but no message yet → when (ns)
	last    uint32           // highest client stream seen
	resets  int              // client resets in the current second
	opened  int              // client streams opened in it
	second  int64            // that second (unix)
	cut     atomic.Bool      // reads end: a guard tripped
	pending Event            // a GOAWAY to write at the next frame boundary
}

func (c *guardedConn) Read(b []byte) (int, error) {
	if c.cut.Load() {
		// grpc-go closes the connection on this error: not before the
		// GOAWAY is out (or the connection closed a second later anyway).
		<-c.done
		return 0, net.ErrClosed
	}
	n, err := c.Conn.Read(b)
	if n > 0 && c.watch {
		// Bytes past the frame that tripped a guard never reach grpc-go:
		// a read carries hundreds of an attacker's frames, each a stream
		// it would otherwise still start.
		n = c.in.feed(b[:n], c.inbound)
	}
	return n, err
}

// inbound follows the client's streams and resets; it reports true when
// the connection is to be cut.
func (c *guardedConn) inbound(typ, flags byte, stream uint32) bool {
	if stream == 0 || stream%2 == 0 || (typ != frameHeaders && typ != frameRST) {
		return false
	}
	c.mu.Lock()
	var event Event
	if s := c.gl.now.Load() / int64(time.Second); s != c.second {
		c.second, c.resets, c.opened = s, 0, 0
	}
	switch typ {
	case frameHeaders:
		if stream > c.last {
			c.last = stream
			c.opened++
			c.lastStream.Store(c.gl.now.Load())
		}
	case frameRST:
		delete(c.waiting, stream)
		c.lastReset.Store(c.gl.now.Load())
		// Many resets, and most of the streams opened: a client that
		// cancels what it asks as a habit, not now and then.
		allowed := c.gl.o.ResetsPerSecond
		if c.probation {
			allowed = min(allowed, probationResets)
		}
		if c.resets++; c.resets > allowed && 2*c.resets > c.opened {
			event = EventRapidReset
		}
	}
	c.mu.Unlock()
	if event == "" {
		return false
	}
	c.cut.Store(true)
	c.goAway(event, true)
	return true
}

func (c *guardedConn) Write(b []byte) (int, error) {
	if !c.watch {
		return c.Conn.Write(b)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n, err := c.Conn.Write(b)
	c.mu.Lock()
	c.out.feed(b[:n], c.outbound)
	goAway := c.pending != "" && err == nil && c.out.atBoundary()
	c.mu.Unlock()
	if goAway {
		c.writeGoAway()
	}
	return n, err
}

// outbound starts waiting for a stream's message when its answer's headers
// go out, and stops when a message does, or the stream ends.
func (c *guardedConn) outbound(typ, flags byte, stream uint32) bool {
	switch {
	case typ == frameHeaders && flags&flagEndStream == 0:
		if _, ok := c.waiting[stream]; !ok {
			c.waiting[stream] = c.gl.now.Load()
		}
	case typ == frameHeaders, typ == frameData, typ == frameRST:
		delete(c.waiting, stream)
	}
	return false
}

// oldestWaiting is when the longest-waiting answer's headers went out (ns),
// or the maximum when none waits.
func (c *guardedConn) oldestWaiting() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	oldest := int64(1<<63 - 1)
	for _, t := range c.waiting {
		oldest = min(oldest, t)
	}
	return oldest
}

// goAway ends the connection for event: with a GOAWAY as soon as the
// server's frames are between two frames, and closed a second later in any
// case, which ends a write blocked on a peer that does not read. It never
// waits for grpc-go's write: if one is in progress, the GOAWAY follows it
// (Write sends it), or a goroutine waits for it. The read path (now) cuts
// the connection right after (grpc-go closes it on the read error), so
// when no write is in progress the GOAWAY is written at once, bounded by a
// second's write deadline; the sweeper always leaves it to a goroutine.
func (c *guardedConn) goAway(event Event, now bool) {
	c.mu.Lock()
	if c.closed.Load() || c.pending != "" {
		c.mu.Unlock()
		return
	}
	c.pending = event
	c.mu.Unlock()
	c.gl.note(event)
	if event != EventProbationReplaced { // an abuse: its address cools down
		c.gl.ban(c.RemoteAddr())
	}
	time.AfterFunc(time.Second, func() { _ = c.Close() })
	if now && c.wmu.TryLock() {
		c.goAwayIfBetweenFrames()
		c.wmu.Unlock()
		return
	}
	go func() {
		c.wmu.Lock()
		defer c.wmu.Unlock()
		c.goAwayIfBetweenFrames()
	}()
}

// goAwayIfBetweenFrames writes the GOAWAY if the server's frames are
// between two frames (the caller holds wmu).
func (c *guardedConn) goAwayIfBetweenFrames() {
	c.mu.Lock()
	atBoundary := c.out.atBoundary()
	c.mu.Unlock()
	if atBoundary && !c.closed.Load() {
		c.writeGoAway()
	}
}

// writeGoAway writes GOAWAY(ENHANCE_YOUR_CALM) naming the last client
// stream seen, and closes the connection. The caller holds wmu, with the
// server's frames at a boundary.
func (c *guardedConn) writeGoAway() {
	var f [frameHeader + 8]byte
	f[2] = 8
	f[3] = frameGoAway
	c.mu.Lock()
	binary.BigEndian.PutUint32(f[9:], c.last)
	c.mu.Unlock()
	binary.BigEndian.PutUint32(f[13:], errCalm)
	_ = c.Conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Conn.Write(f[:])
	_ = c.Close()
}

func (c *guardedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		if c.done != nil {
			close(c.done)
		}
		if c.counted {
			c.gl.release(c.host)
		}
		if c.counted && c.probation {
			c.gl.leaveProbation(c)
		}
		c.gl.conns.Delete(c)
	}
	return c.Conn.Close()
}
