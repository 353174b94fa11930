package h2guard

import (
	"errors"
	"net"
	"os"
	"slices"
	"sync/atomic"
	"time"
)

// The line. A new connection of a cooling address that finds every place
// on probation taken waits in its address's line, unanswered, and the
// line is admitted from its front as places free (see probation.go).
//
// Meanwhile what its client sends is read, up to waitBuffer bytes, and
// replayed to gRPC once it is admitted. A client that closes while it
// waits has left the line; one that resets a stream before it was even
// answered is an attacker's fire-and-forget dial (it wrote its streams and
// resets without waiting for the server, as rapid-reset tools do): it
// leaves the line at once for the tarpit, counted as reset_in_line, and
// its address's cooldown starts anew. Without this, such dials, cheaper to
// make than places are to free, fill the line and push every neighbour's
// dial out of it; read, each costs this process an accept and a read, and
// the line holds the dials of clients that wait for an answer, the
// neighbours' among them, which then take their turns. Under TLS the
// client cannot send frames before the handshake, so only a close is
// seen.
//
// The tarpit holds such a dial open, unread and unanswered, until the
// cooldown ends (tarpitPerHost per address, tarpitTotal in all; past
// them it is closed at once). Closed at once, an attacker redials in a
// tight loop, and each dial costs this process an accept, a read and a
// close; held, its dials wait, and cost nothing.
//
// A line holds at most linePerHost connections, and all lines lineTotal.
// Past linePerHost the longest-waiting connection is closed to make room:
// it is the likeliest to be a dial its client gave up on (gRPC's connect
// timeout is 20 s, Envoy's 5 s by default). Past lineTotal a new one is
// closed at once. When the cooldown ends, what is still in line is
// admitted like any connection.
const (
	linePerHost   = 16
	lineTotal     = 1024
	waitBuffer    = 4 << 10
	tarpitPerHost = 16
	tarpitTotal   = 1024
)

// waiter is a connection in line, read while it waits.
type waiter struct {
	net.Conn
	host string
	// buf is what the client sent while it waited: appended to by the
	// reader until done closes, then replayed by Read.
	buf  []byte
	done chan struct{}
	left atomic.Bool // the client closed, or reset a stream, while it waited
}

func (w *waiter) Read(b []byte) (int, error) {
	if len(w.buf) > 0 {
		n := copy(b, w.buf)
		w.buf = w.buf[n:]
		return n, nil
	}
	return w.Conn.Read(b)
}

// stop ends the reading of w, admitted, and reports whether its client
// left the line meanwhile.
func (w *waiter) stop() (left bool) {
	_ = w.Conn.SetReadDeadline(time.Unix(1, 0))
	<-w.done
	_ = w.Conn.SetReadDeadline(time.Time{})
	return w.left.Load()
}

// read reads w while it waits, until it is admitted (stop), its client
// leaves, or waitBuffer bytes came.
func (gl *Listener) read(w *waiter) {
	defer close(w.done)
	w.buf = make([]byte, 0, waitBuffer)
	in := frameReader{preface: len(clientPreface)}
	for len(w.buf) < cap(w.buf) {
		n, err := w.Conn.Read(w.buf[len(w.buf):cap(w.buf)])
		reset := false
		if n > 0 && gl.watch {
			in.feed(w.buf[len(w.buf):len(w.buf)+n], func(typ, _ byte, _ uint32) bool {
				reset = typ == frameRST
				return reset
			}, nil)
		}
		w.buf = w.buf[:len(w.buf)+n]
		if reset || err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			w.left.Store(true)
			gl.leaveLine(w, reset)
			return
		}
		if err != nil {
			return
		}
	}
}

// leaveLine takes w out of its line, its client gone or, with reset, an
// attacker's: that one goes to the tarpit.
func (gl *Listener) leaveLine(w *waiter, reset bool) {
	gl.hostMu.Lock()
	line := gl.line[w.host]
	i := slices.Index(line, w)
	if i >= 0 {
		gl.lineTotal--
		if gl.line[w.host] = slices.Delete(line, i, i+1); len(gl.line[w.host]) == 0 {
			delete(gl.line, w.host)
		}
	}
	held := i >= 0 && reset && gl.tarpitLocked(w.host, w.Conn)
	gl.hostMu.Unlock()
	if i >= 0 && !held { // else held, or being admitted: the admitter closes it
		_ = w.Conn.Close()
	}
	if reset {
		// The ban first: the event reports what was done (a test that saw
		// the event found the cooldown not yet renewed).
		gl.ban(w.RemoteAddr())
		gl.note(EventResetInLine)
	}
}

// tarpitLocked holds c, of host, in the tarpit, or reports false when
// the tarpit is full. The caller holds hostMu.
func (gl *Listener) tarpitLocked(host string, c net.Conn) bool {
	if len(gl.tarpit[host]) >= tarpitPerHost || gl.tarpitTotal >= tarpitTotal {
		return false
	}
	gl.tarpit[host] = append(gl.tarpit[host], c)
	gl.tarpitTotal++
	return true
}

// releaseTarpit closes the held connections of addresses no longer
// cooling (all, once the listener closes).
func (gl *Listener) releaseTarpit(all bool) {
	gl.hostMu.Lock()
	defer gl.hostMu.Unlock()
	for host, conns := range gl.tarpit {
		if _, cooling := gl.banned.Load(host); cooling && !all {
			continue
		}
		for _, c := range conns {
			_ = c.Close()
		}
		gl.tarpitTotal -= len(conns)
		delete(gl.tarpit, host)
	}
}

// wait puts c, a new connection of host while it cools down, at the back
// of host's line, and admits from the line what may be admitted now. It
// returns the connections admitted, for Accept.
func (gl *Listener) wait(c net.Conn, host string) []*guardedConn {
	gl.hostMu.Lock()
	if gl.lineTotal >= lineTotal && len(gl.line[host]) < linePerHost {
		gl.hostMu.Unlock()
		gl.note(EventConnectionRefused)
		_ = c.Close()
		return nil
	}
	var dropped []net.Conn
	if line := gl.line[host]; len(line) >= linePerHost {
		dropped = append(dropped, line[0])
		gl.line[host] = slices.Delete(line, 0, 1)
		gl.lineTotal--
	}
	w := &waiter{Conn: c, host: host, done: make(chan struct{})}
	go gl.read(w)
	gl.line[host] = append(gl.line[host], w)
	gl.lineTotal++
	admitted, evicted, refused := gl.admitLineLocked(host, true)
	waits := slices.Contains(gl.line[host], w)
	gl.hostMu.Unlock()
	gl.settle(evicted, append(dropped, refused...))
	if waits {
		gl.note(EventConnectionHeld)
	}
	return gl.ready(admitted)
}

// admitFromLine admits from host's line what may be admitted now, and
// hands it to Accept.
func (gl *Listener) admitFromLine(host string) {
	cooling := gl.coolingHost(host)
	gl.hostMu.Lock()
	admitted, evicted, refused := gl.admitLineLocked(host, cooling)
	gl.hostMu.Unlock()
	gl.settle(evicted, refused)
	for _, gc := range gl.ready(admitted) {
		go gl.deliver(accepted{conn: gc})
	}
}

// ready stops reading the connections admitted from a line and returns
// those whose clients are still there; the others are closed, which
// frees their places.
func (gl *Listener) ready(admitted []*guardedConn) []*guardedConn {
	return slices.DeleteFunc(admitted, func(gc *guardedConn) bool {
		if w, ok := gc.Conn.(*waiter); ok && w.stop() {
			_ = gc.Close()
			return true
		}
		return false
	})
}

// admitLineLocked admits host's line from its front: while host cools
// down, as long as a place on probation is free or given way; otherwise
// all of it. It returns the connections admitted, those on probation that
// gave their places, and those refused at the caps. The caller holds
// hostMu.
func (gl *Listener) admitLineLocked(host string, cooling bool) (admitted, evicted []*guardedConn, refused []net.Conn) {
	line := gl.line[host]
	now := gl.clock().UnixNano()
	n := 0
	for ; n < len(line); n++ {
		place := -1
		if cooling {
			if place = gl.placeLocked(host, now); place < 0 {
				break
			}
		}
		if !gl.admitLocked(host) {
			refused = append(refused, line[n])
			continue
		}
		gc := gl.guard(line[n], host, cooling)
		admitted = append(admitted, gc)
		if !cooling {
			continue
		}
		conns := gl.probation[host]
		if place < len(conns) {
			if !conns[place].closed.Load() { // else a place held after abuse, now free
				evicted = append(evicted, conns[place])
			}
			conns = slices.Delete(conns, place, place+1)
		}
		gl.probation[host] = append(conns, gc)
	}
	gl.lineTotal -= n
	if gl.line[host] = slices.Delete(line, 0, n); len(gl.line[host]) == 0 {
		delete(gl.line, host)
	}
	return admitted, evicted, refused
}
