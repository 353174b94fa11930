package h2guard

import (
	"encoding/binary"
	"sync/atomic"
	"time"
)

// Request bodies. grpc-go holds a request message's bytes from its first
// DATA frame until the message is whole, with no timeout of its own: a
// client that declares a large message and sends all of it but the last
// byte holds that memory for as long as it likes, on every stream it may
// open (TestSlowPartialBodiesAreBounded; figures in docs/operations.md).
// So the guard follows every client stream's gRPC
// messages (the five-byte prefix that gives each one's length) and counts
// the bytes of each message begun and not yet whole:
//
//   - against the request-byte budget (Budget, GRPC_MAX_REQUEST_BYTES_IN_FLIGHT),
//     which the server's codec then charges for the message while it is
//     decoded and served: a stream whose bytes would pass it is refused
//     (streams.go: that stream alone, its connection kept, since the
//     connection may carry others' calls), but its address does not cool
//     down, since the budget may be full of other addresses' bytes;
//   - against its address's share of the budget (a quarter of it,
//     shareOfBudget): bytes that would take an address past its share
//     while the budget is over three quarters full have their stream refused for
//     abuse (its address cools down, see probation.go), and while an
//     address is past its share, each of its messages begun slowBody ago
//     or more is refused so too, so that one address cannot hold most of
//     the budget with bodies it does not finish. A client that sends many
//     large requests at once, each finished in moments, is not refused for
//     it while the budget has room;
//   - against time: a message still not whole stalledBody after its first
//     byte has its stream refused for abuse. A client that sends a message
//     sends it at the speed of its link; Envoy's arrive in one frame.
//
// A message that ends in the DATA frame it began in (every request of
// Envoy's, in practice) is never counted: bytes are counted at the end of
// a frame, for a message still unfinished then.
const (
	shareOfBudget = 4
	slowBody      = 10 * time.Second
	stalledBody   = 30 * time.Second
	prefixLen     = 5   // a gRPC message's compression flag and length
	messageCost   = 256 // bytes an unfinished message's record counts for, beside its own
	flagPadded    = 0x8
)

// Budget is how many bytes requests may hold at once, shared by the
// guards (bodies still arriving) and the server's codec (whole requests
// being decoded and served), so that the two together stay under one
// bound.
type Budget struct {
	max  int64
	used atomic.Int64
}

// NewBudget returns a budget of max bytes.
func NewBudget(max int64) *Budget { return &Budget{max: max} }

// Max is the budget's size.
func (b *Budget) Max() int64 { return b.max }

// Take takes n bytes, or nothing and reports false when they do not fit.
func (b *Budget) Take(n int64) bool {
	if b.used.Add(n) > b.max {
		b.used.Add(-n)
		return false
	}
	return true
}

// Used is how many bytes are taken now.
func (b *Budget) Used() int64 { return b.used.Load() }

// Give gives back n bytes taken.
func (b *Budget) Give(n int64) { b.used.Add(-n) }

// share is an address's count of body bytes, against its share of the
// budget; refs counts the watched connections that use it.
type share struct {
	refs     int
	used     atomic.Int64
	awaiting atomic.Int64 // its connections' pending streams (streams.go)
}

// message is where one client stream is in its messages: the prefix of
// the next one (have bytes of it read), or the bytes of the current one
// still to come (left). held is what this message counts against the
// budget and its address's share; since is when its first byte came (ns,
// the listener's clock).
type message struct {
	prefix [prefixLen]byte
	have   int
	left   uint32
	held   int64
	since  int64
}

// unfinished reports whether a message has begun and not ended.
func (m *message) unfinished() bool { return m.have > 0 || m.left > 0 }

// body is the DATA frame being read on a connection: its stream's message
// (cur), how many of its bytes are data still to come (padding aside),
// whether its pad length is still to read, whether it ends its stream,
// and the bytes of an unfinished message it brought so far.
type body struct {
	cur                 *message
	stream              uint32
	data                int
	padPending, endsStr bool
	fresh               int64
	scratch             message // cur for a stream that had no message unfinished
	discard             message // cur for a stream the server ended: nothing counted
}

// maxEnded bounds a connection's record of streams the server ended
// before the client finished sending (see guardedConn.ended): past it the
// lowest is forgotten, and its late bytes read as a new message would,
// counted against the budget and cut like one.
const maxEnded = 1024

// serverEnded notes that the server ended a client stream: what its
// unfinished message held is given back and, when the client was in the
// middle of a message or of a DATA frame of it, the stream is recorded
// and the rest of that frame counts nothing (a stream whose client sent
// all it had, as a unary call's has by its answer, needs no record). The
// caller holds mu.
func (c *guardedConn) serverEnded(stream uint32) {
	b := &c.body
	midFrame := b.stream == stream && b.data > 0 && b.cur != &b.discard
	_, midMessage := c.messages[stream]
	c.settle(stream)
	c.dropMessage(stream)
	if midFrame {
		b.discard = message{}
		b.cur = &b.discard
	}
	if midFrame || midMessage {
		c.endedByServer(stream)
	}
}

// endedByServer records a client stream the server ended. The caller
// holds mu.
func (c *guardedConn) endedByServer(stream uint32) {
	if c.ended == nil {
		c.ended = map[uint32]struct{}{}
	}
	if len(c.ended) >= maxEnded {
		lowest := stream
		for s := range c.ended {
			lowest = min(lowest, s)
		}
		delete(c.ended, lowest)
	}
	c.ended[stream] = struct{}{}
}

// beginData starts reading a DATA frame of a client stream. The caller
// holds mu.
func (c *guardedConn) beginData(stream uint32, flags byte, length uint32) {
	b := &c.body
	b.stream, b.data, b.fresh = stream, int(length), 0
	b.padPending, b.endsStr = flags&flagPadded != 0, flags&flagEndStream != 0
	if m, ok := c.messages[stream]; ok {
		b.cur = m
	} else if _, ok := c.ended[stream]; ok {
		// The rest of a body the server stopped reading: not a new
		// message. (A 3 MB request refused from its prefix kept sending;
		// read as messages, its bytes held the budget for as long as
		// the client took, and a slow client was cut for it.)
		b.discard = message{}
		b.cur = &b.discard
	} else {
		b.scratch = message{}
		b.cur = &b.scratch
	}
	if length == 0 {
		c.endData()
	}
}

// inboundData reads a chunk of a DATA frame's payload; it reports true
// when the connection is to be cut.
func (c *guardedConn) inboundData(p []byte) bool {
	c.mu.Lock()
	b := &c.body
	if b.padPending {
		b.padPending = false
		b.data = max(b.data-1-int(p[0]), 0)
		p = p[1:]
	}
	n := min(len(p), b.data)
	b.data -= n
	c.consume(p[:n])
	var refuse Event
	cut := false
	if c.in.skip == 0 {
		if refuse = c.endData(); refuse != "" {
			c.resetsAfter = max(c.resetsAfter, c.in.done)
			cut = c.refuseLocked(b.stream, refuse)
		}
	}
	c.mu.Unlock()
	if refuse == "" {
		return false
	}
	c.refused(refuse)
	if !cut {
		c.sendResets()
		return false
	}
	c.cut.Store(true)
	c.goAway(EventRefusedStreams, true)
	return true
}

// consume follows data through the current stream's messages. The caller
// holds mu.
func (c *guardedConn) consume(data []byte) {
	b, m := &c.body, c.body.cur
	if m == &b.discard {
		return
	}
	for len(data) > 0 {
		if m.left == 0 {
			if m.have == 0 {
				m.since = c.gl.now.Load()
			}
			n := copy(m.prefix[m.have:], data)
			m.have += n
			data = data[n:]
			b.fresh += int64(n)
			if m.have == prefixLen {
				m.have, m.left = 0, binary.BigEndian.Uint32(m.prefix[1:])
				if m.left == 0 {
					c.finish(m)
				}
			}
			continue
		}
		n := min(int(m.left), len(data))
		m.left -= uint32(n)
		data = data[n:]
		b.fresh += int64(n)
		if m.left == 0 {
			c.finish(m)
		}
	}
}

// finish ends a message of the stream being read: what it held is given
// back, and the stream is no longer pending. The caller holds mu.
func (c *guardedConn) finish(m *message) {
	c.give(m.held)
	m.held, c.body.fresh = 0, 0
	c.settle(c.body.stream)
}

// endData ends the DATA frame being read: the bytes of a message still
// unfinished are counted, and the event to refuse its stream for returned
// if they do not fit. The caller holds mu.
func (c *guardedConn) endData() Event {
	b := &c.body
	m := b.cur
	if m == &b.discard {
		if b.endsStr {
			delete(c.ended, b.stream)
		}
		return ""
	}
	if b.endsStr || !m.unfinished() {
		c.finish(m)
		delete(c.messages, b.stream)
		return ""
	}
	n := b.fresh
	if m == &b.scratch {
		// What remembering it costs, counted as its bytes are: else a
		// prefix byte on each of millions of streams grpc-go has closed
		// (their data it drops) would hold a record each for a byte each.
		n += messageCost
	}
	b.fresh = 0
	if n == 0 {
		return ""
	}
	if event := c.admitBytes(n); event != "" {
		return event
	}
	if m == &b.scratch {
		if c.messages == nil {
			c.messages = map[uint32]*message{}
		}
		m = new(message)
		*m = b.scratch
		c.messages[b.stream] = m
		b.cur = m
	}
	m.held += n
	if c.share != nil {
		c.share.used.Add(n)
	}
	return ""
}

// admitBytes takes n bytes of an unfinished message from the budget, or
// returns why its stream is refused: the budget is full, or its address
// would pass its share while the budget is over three quarters full (an
// address's burst of large requests, each finished in moments, passes
// while there is room; the sweeper refuses its slow ones), so that one
// address leaves others a quarter of it at least.
func (c *guardedConn) admitBytes(n int64) Event {
	budget := c.gl.o.Bytes
	if c.share != nil && c.share.used.Load()+n > budget.Max()/shareOfBudget && budget.Used()+n > budget.Max()/4*3 {
		return EventRequestBytes
	}
	if !budget.Take(n) {
		return EventBudgetFull
	}
	return ""
}

// give gives back n bytes of bodies. The caller holds mu.
func (c *guardedConn) give(n int64) {
	if n == 0 {
		return
	}
	c.gl.o.Bytes.Give(n)
	if c.share != nil {
		c.share.used.Add(-n)
	}
}

// dropMessage forgets a stream's unfinished message (the stream ended).
// The caller holds mu.
func (c *guardedConn) dropMessage(stream uint32) {
	if m, ok := c.messages[stream]; ok {
		c.give(m.held)
		delete(c.messages, stream)
	}
}

// releaseBodies gives back everything c's bodies hold, and its address's
// share (c closed).
func (c *guardedConn) releaseBodies() {
	c.mu.Lock()
	for stream := range c.messages {
		c.dropMessage(stream)
	}
	c.settleAll()
	c.mu.Unlock()
	if c.share != nil {
		c.gl.leaveShare(c.host)
	}
}

// joinShare returns host's share, counting one more connection on it; nil
// for a Unix socket's peers, which share one empty address (as for ban).
func (gl *Listener) joinShare(host string) *share {
	if host == "" {
		return nil
	}
	gl.sharesMu.Lock()
	defer gl.sharesMu.Unlock()
	s := gl.shares[host]
	if s == nil {
		s = new(share)
		gl.shares[host] = s
	}
	s.refs++
	return s
}

// leaveShare counts one connection less on host's share.
func (gl *Listener) leaveShare(host string) {
	gl.sharesMu.Lock()
	defer gl.sharesMu.Unlock()
	if s := gl.shares[host]; s != nil {
		if s.refs--; s.refs <= 0 {
			delete(gl.shares, host)
		}
	}
}
