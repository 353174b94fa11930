package h2guard

import (
	"encoding/binary"
	"errors"
	"net"
	"os"
	"time"
)

// Streams before their request, header blocks, and refusing one stream.
//
// grpc-go starts a handler (a goroutine, the stream's state, its decoded
// headers) for every stream whose HEADERS arrive, and that handler waits
// for the request message for as long as the client likes, and no byte
// budget saw such streams, since they send no bytes of a body
// (docs/operations.md has what they held). So the guard counts
// every client stream from its HEADERS until its first request message is
// whole (or its client ends it, or the server does): a pending stream.
//
//   - An address may hold pendingPerAddress pending streams; a stream past
//     that is refused, and its address cools down (probation.go).
//   - All addresses together may hold pendingInAll; past that, a stream of
//     an address that holds pendingFloor or more is refused (without
//     cooldown: the others may be the abusers), so an address with few,
//     an Envoy whose requests arrive with their HEADERS, is never refused
//     for someone else's.
//   - A stream still pending pendingTimeout after its HEADERS is refused,
//     and its address cools down: a request arrives in moments, Envoy's in
//     the frame after its HEADERS.
//
// A header block (HEADERS and its CONTINUATIONs, until END_HEADERS) holds
// its connection, since nothing else may come on it until it ends, and
// grpc-go buffers it: a block past maxHeaderBlock bytes, or unfinished
// headerBlockTimeout after it began, cuts its connection for abuse. That
// connection carries no one else's calls while the block is open.
//
// Refusing a stream leaves the connection and every other stream on it
// alone, where cutting the connection failed every call an Envoy had on
// it (Envoy multiplexes a worker's calls on one connection). The guard
// tells grpc-go that the client reset the stream (an RST_STREAM(CANCEL)
// put between two of the client's frames, so the handler ends and what
// grpc-go held for it is freed; grpc-go answers a client's reset with
// nothing), and tells the client with an RST_STREAM(ENHANCE_YOUR_CALM)
// put between two of the server's frames (a gRPC client reads it as
// ResourceExhausted). The stream's later bytes count nothing (bodies.go's
// ended streams), and grpc-go, which gives back the connection's
// flow-control window as it reads, drops them. A connection whose streams
// were refused for abuse refusalsToCut times is then cut for abuse too.
const (
	pendingPerAddress  = 1000
	pendingInAll       = 10000
	pendingFloor       = 8
	pendingTimeout     = 10 * time.Second
	maxHeaderBlock     = 64 << 10
	headerBlockTimeout = 10 * time.Second
	refusalsToCut      = 64
	frameContinuation  = 0x9
	flagEndHeaders     = 0x4
	errCancel          = 0x8
	rstLen             = frameHeader + 4
)

// headerBlock is the header block being read on a connection: its bytes
// so far and when it began (ns, the listener's clock).
type headerBlock struct {
	open  bool
	bytes int
	since int64
}

// beginBlock follows a client HEADERS frame's header block; it returns
// the event to cut the connection for, if any. The caller holds mu.
func (c *guardedConn) beginBlock(flags byte, length uint32) Event {
	if flags&flagEndHeaders != 0 {
		c.block = headerBlock{}
		return ""
	}
	c.block = headerBlock{open: true, bytes: int(length), since: c.gl.now.Load()}
	return c.blockTooLarge()
}

// continueBlock follows a CONTINUATION frame of the block. The caller
// holds mu.
func (c *guardedConn) continueBlock(flags byte, length uint32) Event {
	if !c.block.open {
		return "" // a protocol error grpc-go answers itself
	}
	c.block.bytes += int(length)
	if event := c.blockTooLarge(); event != "" {
		return event
	}
	if flags&flagEndHeaders != 0 {
		c.block = headerBlock{}
	}
	return ""
}

func (c *guardedConn) blockTooLarge() Event {
	if c.block.bytes > maxHeaderBlock {
		return EventHeaderBlock
	}
	return ""
}

// blockStalled reports whether a header block has been open since before
// the given instant (ns).
func (c *guardedConn) blockStalled(before int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.block.open && c.block.since < before
}

// openPending counts a new client stream as pending, or returns the event
// it is refused for. The caller holds mu.
func (c *guardedConn) openPending(stream uint32) Event {
	var mine int64
	if c.share != nil {
		mine = c.share.awaiting.Load()
	}
	switch {
	case mine >= pendingPerAddress:
		return EventPendingStreams
	case c.gl.awaiting.Load() >= pendingInAll && mine >= pendingFloor:
		return EventPendingFull
	}
	now := c.gl.now.Load()
	switch {
	case c.one == 0:
		// The usual case, a request whose message follows its HEADERS at
		// once: no map operation (they were a quarter of the guard's
		// work for a unary call).
		c.one, c.oneSince = stream, now
	default:
		if c.awaiting == nil {
			c.awaiting = map[uint32]int64{}
		}
		c.awaiting[stream] = now
	}
	c.gl.awaiting.Add(1)
	if c.share != nil {
		c.share.awaiting.Add(1)
	}
	return ""
}

// settle ends a stream's pending time: its request is whole, or it ended.
// The caller holds mu.
func (c *guardedConn) settle(stream uint32) {
	switch _, ok := c.awaiting[stream]; {
	case stream != 0 && stream == c.one:
		c.one = 0
	case ok:
		delete(c.awaiting, stream)
	default:
		return
	}
	c.gl.awaiting.Add(-1)
	if c.share != nil {
		c.share.awaiting.Add(-1)
	}
}

// settleAll ends every pending stream (the connection closed). The caller
// holds mu.
func (c *guardedConn) settleAll() {
	c.settle(c.one)
	for stream := range c.awaiting {
		c.settle(stream)
	}
}

// refusal is a stream the sweeper refuses, and why.
type refusal struct {
	stream uint32
	event  Event
}

// overdue returns the streams the sweeper refuses at now (ns): those
// pending for pendingTimeout, those whose message has been unfinished for
// stalledBody, and, while the address is past its share of the byte
// budget, those whose message began slowBody ago or more.
func (c *guardedConn) overdue(now int64) []refusal {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []refusal
	if c.one != 0 && c.oneSince < now-int64(pendingTimeout) {
		out = append(out, refusal{c.one, EventStalledRequest})
	}
	for stream, since := range c.awaiting {
		if since < now-int64(pendingTimeout) {
			out = append(out, refusal{stream, EventStalledRequest})
		}
	}
	overShare := c.share != nil && c.share.used.Load() > c.gl.o.Bytes.Max()/shareOfBudget
	for stream, m := range c.messages {
		switch {
		case m.since < now-int64(stalledBody):
			out = append(out, refusal{stream, EventStalledBody})
		case overShare && m.since <= now-int64(slowBody):
			out = append(out, refusal{stream, EventRequestBytes})
		}
	}
	return out
}

// refuseLocked ends one client stream, leaving the connection: what the
// guard holds for it is given back, its later bytes count nothing, and
// an RST_STREAM is queued each way (see the note above). It reports
// whether the connection is now to be cut, past refusalsToCut refusals
// for abuse. The caller holds mu.
func (c *guardedConn) refuseLocked(stream uint32, event Event) (cut bool) {
	c.settle(stream)
	b := &c.body
	midFrame := b.stream == stream && b.data > 0
	c.dropMessage(stream)
	if midFrame {
		b.discard = message{}
		b.cur = &b.discard
	}
	c.endedByServer(stream)
	delete(c.waiting, stream)
	c.toServer = append(c.toServer, stream)
	c.toClient = append(c.toClient, stream)
	if event.abuse() {
		c.abuseRefusals++
	}
	return c.abuseRefusals >= refusalsToCut
}

// refuse refuses streams from outside the read path (the sweeper): the
// reader, which may be blocked on a client that sends nothing, is woken
// to hand grpc-go the resets.
func (c *guardedConn) refuse(rs []refusal) {
	if len(rs) == 0 {
		return
	}
	c.mu.Lock()
	cut := false
	for _, r := range rs {
		cut = c.refuseLocked(r.stream, r.event) || cut
	}
	c.mu.Unlock()
	for _, r := range rs {
		c.refused(r.event)
	}
	if cut {
		c.goAway(EventRefusedStreams, false)
		return
	}
	c.wakeReader()
	c.sendResets()
}

// refused notes a stream refused for event, and starts its address's
// cooldown when event is an abuse.
func (c *guardedConn) refused(event Event) {
	if event.abuse() {
		c.gl.ban(c.RemoteAddr())
	}
	c.gl.note(event)
}

// wakeReader ends a read blocked on the client, so that Read hands
// grpc-go the resets queued for it.
func (c *guardedConn) wakeReader() {
	c.woken.Store(true)
	_ = c.Conn.SetReadDeadline(time.Now())
}

// takeResets returns the resets queued for grpc-go, as RST_STREAM frames
// from the client, if they may go in at a boundary between frames after
// done frames: after the frame the read path refused a stream in
// (resetsAfter), anywhere for the sweeper's.
func (c *guardedConn) takeResets(done int) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.toServer) == 0 || done <= c.resetsAfter {
		return nil
	}
	b := make([]byte, rstLen*len(c.toServer))
	for i, s := range c.toServer {
		putRST(b[i*rstLen:], s, errCancel)
	}
	c.toServer, c.resetsAfter = nil, -1
	return b
}

// sendResets writes the resets queued for the client, if the server's
// frames are between two frames: at once when wmu is free, else after the
// write in progress (Write sends them, and a goroutine waits for it, in
// case they were queued after Write looked). Where the server's frames
// are inside a frame then, the next Write sends them; if none has within
// resetWait, the connection closes: a refused stream's client must hear
// of it one way or the other, or its sends wait for a window that never
// comes.
func (c *guardedConn) sendResets() {
	if c.wmu.TryLock() {
		left := c.writeResets()
		c.wmu.Unlock()
		c.closeIfStillQueued(left)
		return
	}
	go func() {
		c.wmu.Lock()
		left := c.writeResets()
		c.wmu.Unlock()
		c.closeIfStillQueued(left)
	}()
}

// resetWait is how long client resets may wait for the server's frames to
// reach a boundary.
const resetWait = time.Second

// closeIfStillQueued closes the connection resetWait from now if client
// resets are queued then, when left says some were just left queued.
func (c *guardedConn) closeIfStillQueued(left bool) {
	if !left {
		return
	}
	time.AfterFunc(resetWait, func() {
		c.mu.Lock()
		queued := len(c.toClient) > 0
		c.mu.Unlock()
		if queued {
			_ = c.Close()
		}
	})
}

// writeResets writes the queued client resets when the server's frames
// are at a boundary, and reports whether some are left queued (the frames
// were not). The caller holds wmu. A client that does not read them within
// a second is not reading anything: its connection closes (a frame written
// in part cannot be taken back).
func (c *guardedConn) writeResets() (left bool) {
	c.mu.Lock()
	if len(c.toClient) == 0 || c.closed.Load() {
		c.mu.Unlock()
		return false
	}
	if !c.out.atBoundary() {
		c.mu.Unlock()
		return true
	}
	frames := make([]byte, rstLen*len(c.toClient))
	for i, s := range c.toClient {
		putRST(frames[i*rstLen:], s, errCalm)
	}
	c.toClient = nil
	c.mu.Unlock()
	_ = c.Conn.SetWriteDeadline(time.Now().Add(time.Second))
	if _, err := c.Conn.Write(frames); err != nil {
		_ = c.Close()
		return false
	}
	_ = c.Conn.SetWriteDeadline(time.Time{})
	return false
}

// putRST writes an RST_STREAM frame of stream with code into b.
func putRST(b []byte, stream, code uint32) {
	b[0], b[1], b[2] = 0, 0, 4
	b[3], b[4] = frameRST, 0
	binary.BigEndian.PutUint32(b[5:], stream)
	binary.BigEndian.PutUint32(b[9:], code)
}

// timedOut reports whether err is a read deadline passing.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// readResets is Read on a watched connection: the bytes the client sent,
// with the resets queued for grpc-go put between two of its frames. What
// goes after the point they go in (they, and the bytes read and fed past
// it) waits in carry for the next Reads.
func (c *guardedConn) readResets(b []byte) (int, error) {
	for {
		if len(c.carry) > 0 {
			n := copy(b, c.carry)
			if c.carry = c.carry[n:]; len(c.carry) == 0 {
				c.carry = nil
			}
			return n, nil
		}
		if c.in.atBoundary() {
			if c.carry = c.takeResets(c.in.done); c.carry != nil {
				continue
			}
		}
		n, err := c.Conn.Read(b)
		if n == 0 && err != nil && timedOut(err) && c.woken.Swap(false) {
			_ = c.Conn.SetReadDeadline(time.Time{}) // woken to hand grpc-go resets
			continue
		}
		if n == 0 {
			return n, err
		}
		// Bytes past the frame that tripped a guard never reach grpc-go:
		// a read carries hundreds of an attacker's frames, each a stream
		// it would otherwise still start.
		n = c.in.feed(b[:n], c.inbound, c.inboundData)
		if c.cut.Load() || c.in.lastAt < 0 {
			return n, err
		}
		resets := c.takeResets(c.in.lastDone)
		if resets == nil {
			return n, err
		}
		at := c.in.lastAt
		c.carry = append(resets, b[at:n]...)
		if at == 0 && err == nil {
			continue
		}
		return at, err
	}
}
