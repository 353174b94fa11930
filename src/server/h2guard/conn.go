package h2guard

import (
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
)

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
	// want is set by a frame's callback to see that frame's payload.
	want bool
	// done counts the frames read whole; lastAt is the offset, in the
	// bytes of the last feed, of the last boundary between two frames
	// (-1: none), and lastDone done there.
	done, lastDone int
	lastAt         int
}

// feed passes b through, calling frame for each complete frame header and
// payload with the payload of each frame whose callback set want, and
// returns how many bytes it passed: all of them, unless a callback returns
// true (stop), which ends the pass right after what it was shown.
func (f *frameReader) feed(b []byte, frame func(typ, flags byte, stream uint32) (stop bool), payload func([]byte) (stop bool)) int {
	total := len(b)
	f.lastAt = -1
	if f.atBoundary() {
		f.lastAt, f.lastDone = 0, f.done
	}
	for len(b) > 0 {
		switch {
		case f.preface > 0:
			n := min(f.preface, len(b))
			f.preface -= n
			b = b[n:]
		case f.skip > 0:
			n := min(int(f.skip), len(b))
			f.skip -= uint32(n)
			chunk := b[:n]
			b = b[n:]
			if f.want && payload(chunk) {
				return total - len(b)
			}
		default:
			n := copy(f.hdr[f.have:], b)
			f.have += n
			b = b[n:]
			if f.have == frameHeader {
				f.have, f.want = 0, false
				f.skip = uint32(f.hdr[0])<<16 | uint32(f.hdr[1])<<8 | uint32(f.hdr[2])
				if frame(f.hdr[3], f.hdr[4], binary.BigEndian.Uint32(f.hdr[5:9])&0x7fffffff) {
					return total - len(b)
				}
			}
		}
		if f.atBoundary() && f.lastAt != total-len(b) {
			f.done++
			f.lastAt, f.lastDone = total-len(b), f.done
		}
	}
	return total
}

// length is the payload length of the frame whose header was read last.
func (f *frameReader) length() uint32 {
	return uint32(f.hdr[0])<<16 | uint32(f.hdr[1])<<8 | uint32(f.hdr[2])
}

// atBoundary reports whether the stream of frames is between two frames.
func (f *frameReader) atBoundary() bool { return f.preface == 0 && f.skip == 0 && f.have == 0 }

// startWatching makes gc parse its frames, and the sweeper look at it.
func (gl *Listener) startWatching(gc *guardedConn) {
	gc.watch, gc.waiting, gc.in, gc.resetsAfter = true, map[uint32]int64{}, frameReader{preface: len(clientPreface)}, -1
	gc.share = gl.joinShare(gc.host)
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
	// vacatesAt is when the place on probation of one closed for abuse
	// frees (ns, the clock; guarded by the listener's hostMu).
	admittedAt, vacatesAt int64
	watcher               atomic.Pointer[guardedConn]
	lastReset, lastStream atomic.Int64
	closed                atomic.Bool
	done                  chan struct{} // closed by Close (watched connections)

	in frameReader // the client's frames; touched by grpc-go's reader only
	// share is the address's count of body bytes (nil for a Unix socket's
	// peer); see bodies.go.
	share *share

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
	// messages holds the client streams' unfinished messages, body the
	// DATA frame being read (see bodies.go).
	messages map[uint32]*message
	body     body
	// one and awaiting hold the client streams whose first request
	// message is not whole yet → when their HEADERS came (ns): one of
	// them in one (0: none), the others in the map; block is the header
	// block being read (streams.go).
	one      uint32
	oneSince int64
	awaiting map[uint32]int64
	block    headerBlock
	// toServer and toClient are the refused streams whose RST_STREAM is
	// still to hand grpc-go and to write to the client; carry is bytes
	// read and fed, held behind resets for grpc-go; resetsAfter is in.done
	// when the read path last refused a stream (-1: none waiting): the
	// resets go in at a boundary after that frame;
	// woken is set when the reader was woken for resets; abuseRefusals
	// counts the streams refused for abuse (streams.go).
	toServer, toClient []uint32
	carry              []byte
	resetsAfter        int
	woken              atomic.Bool
	abuseRefusals      int
	// ended holds client streams the server ended (trailers or a reset)
	// in the middle of their bodies' messages, which the client may still
	// be sending: those bytes are
	// the rest of a message already dropped, which grpc-go discards, not
	// the start of a new one (bodies.go). At most maxEnded.
	ended map[uint32]struct{}
}

func (c *guardedConn) Read(b []byte) (int, error) {
	if c.cut.Load() {
		// grpc-go closes the connection on this error: not before the
		// GOAWAY is out (or the connection closed a second later anyway).
		<-c.done
		return 0, net.ErrClosed
	}
	if !c.watch {
		return c.Conn.Read(b)
	}
	return c.readResets(b)
}

// inbound follows the client's streams, header blocks and resets; it
// reports true when the connection is to be cut.
func (c *guardedConn) inbound(typ, flags byte, stream uint32) bool {
	if stream == 0 || stream%2 == 0 {
		return false
	}
	if typ == frameData {
		c.mu.Lock()
		c.beginData(stream, flags, c.in.length())
		c.mu.Unlock()
		c.in.want = c.in.skip > 0
		return false
	}
	if typ != frameHeaders && typ != frameRST && typ != frameContinuation {
		return false
	}
	c.mu.Lock()
	var event, refuse Event
	if s := c.gl.now.Load() / int64(time.Second); s != c.second {
		c.second, c.resets, c.opened = s, 0, 0
	}
	switch typ {
	case frameHeaders:
		event = c.beginBlock(flags, c.in.length())
		if stream > c.last {
			c.last = stream
			c.opened++
			c.lastStream.Store(c.gl.now.Load())
			if flags&flagEndStream == 0 {
				refuse = c.openPending(stream)
			}
		}
		if flags&flagEndStream != 0 { // trailers: no more data
			c.settle(stream)
			c.dropMessage(stream)
			delete(c.ended, stream)
		}
	case frameContinuation:
		event = c.continueBlock(flags, c.in.length())
	case frameRST:
		event = c.clientReset(stream)
	}
	if refuse != "" && event == "" {
		c.resetsAfter = max(c.resetsAfter, c.in.done)
		if c.refuseLocked(stream, refuse) {
			event = EventRefusedStreams
		}
	}
	c.mu.Unlock()
	if refuse != "" {
		c.refused(refuse)
	}
	if event == "" {
		if refuse != "" {
			c.sendResets()
		}
		return false
	}
	c.cut.Store(true)
	c.goAway(event, true)
	return true
}

// clientReset follows a client's RST_STREAM; it returns the event to cut
// the connection for, if any. The caller holds mu.
func (c *guardedConn) clientReset(stream uint32) Event {
	delete(c.waiting, stream)
	c.settle(stream)
	c.dropMessage(stream)
	delete(c.ended, stream)
	c.lastReset.Store(c.gl.now.Load())
	// Many resets, and most of the streams opened: a client that
	// cancels what it asks as a habit, not now and then.
	allowed := c.gl.o.ResetsPerSecond
	if c.probation {
		allowed = min(allowed, probationResets)
	}
	if c.resets++; c.resets > allowed && 2*c.resets > c.opened {
		return EventRapidReset
	}
	return ""
}

func (c *guardedConn) Write(b []byte) (int, error) {
	if !c.watch {
		return c.Conn.Write(b)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n, err := c.Conn.Write(b)
	c.mu.Lock()
	c.out.feed(b[:n], c.outbound, nil)
	atBoundary := err == nil && c.out.atBoundary()
	goAway, resets := atBoundary && c.pending != "", atBoundary && len(c.toClient) > 0
	c.mu.Unlock()
	if resets {
		_ = c.writeResets()
	}
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
	if typ == frameRST || typ == frameHeaders && flags&flagEndStream != 0 {
		c.serverEnded(stream) // the stream is over: grpc-go drops what comes
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

// cutForAbuse reports whether a guard cut c for abuse (not for giving
// its place on probation).
func (c *guardedConn) cutForAbuse() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pending != "" && c.pending.abuse()
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
	if event.abuse() { // its address cools down
		c.gl.ban(c.RemoteAddr())
	}
	c.gl.note(event) // after the ban: the event reports what was done
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
		if c.watch {
			c.releaseBodies()
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
