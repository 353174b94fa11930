package h2guard

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

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
	// accepted carries what Accept returns: the connections acceptLoop
	// admits as they come, and those a cooling address's line admits
	// later (see probation.go).
	accepted chan accepted
	// perHost counts open connections by address (IP).
	hostMu  sync.Mutex
	perHost map[string]int
	// probation holds, by address, the open connections admitted while
	// it cooled (at most probationConns each); line the connections
	// waiting for one of those places, oldest first.
	probation map[string][]*guardedConn
	line      map[string][]*waiter
	lineTotal int
	// tarpit holds, by address, the connections dropped from a line for
	// a reset, until the address's cooldown ends (see line.go).
	tarpit      map[string][]net.Conn
	tarpitTotal int
	stop        chan struct{}
	once        sync.Once
	// shares counts, by address, the bytes of unfinished request
	// messages (see bodies.go). sharesMu guards it: a connection joins
	// its share when it is watched, which may be under hostMu.
	sharesMu sync.Mutex
	shares   map[string]*share
	// awaiting counts the pending streams of every connection
	// (streams.go).
	awaiting atomic.Int64
	// now is the sweeper's clock (ns), a second coarse: stamping each
	// stream with it costs a load, not a clock read.
	now atomic.Int64
	// clock decides cooldowns and probation, and sets now: time.Now
	// (tests set another).
	clock func() time.Time
}

// accepted is one result of the wrapped listener's Accept.
type accepted struct {
	conn net.Conn
	err  error
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
		accepted: make(chan accepted), probation: map[string][]*guardedConn{}, line: map[string][]*waiter{},
		tarpit: map[string][]net.Conn{}, shares: map[string]*share{}, clock: clock}
	gl.now.Store(clock().UnixNano())
	go gl.sweep()
	go gl.acceptLoop()
	return gl
}

// Accept returns the next admitted connection. A connection of a cooling
// address may be admitted after others that came later from elsewhere:
// it waited in its address's line.
func (gl *Listener) Accept() (net.Conn, error) {
	select {
	case a := <-gl.accepted:
		return a.conn, a.err
	case <-gl.stop:
		return nil, net.ErrClosed
	}
}

// acceptLoop accepts from the wrapped listener until Close: it admits a
// connection within the caps, closes one past them, and hands one of a
// cooling address to its line.
func (gl *Listener) acceptLoop() {
	for {
		c, err := gl.Listener.Accept()
		if err != nil {
			if !gl.deliver(accepted{err: err}) {
				return
			}
			continue
		}
		host := Host(c.RemoteAddr())
		if gl.cooling(c.RemoteAddr()) {
			for _, gc := range gl.wait(c, host) {
				if !gl.deliver(accepted{conn: gc}) {
					return
				}
			}
			continue
		}
		gl.hostMu.Lock()
		ok := gl.admitLocked(host)
		gl.hostMu.Unlock()
		if !ok {
			gl.note(EventConnectionRefused)
			_ = c.Close()
			continue
		}
		if !gl.deliver(accepted{conn: gl.guard(c, host, false)}) {
			return
		}
	}
}

// guard wraps c, admitted and counted, and watches it when the listener
// carries plaintext.
func (gl *Listener) guard(c net.Conn, host string, probation bool) *guardedConn {
	gc := &guardedConn{Conn: c, gl: gl, host: host, counted: true, probation: probation, admittedAt: gl.clock().UnixNano()}
	if gl.watch {
		gc.watcher.Store(gc)
		gl.startWatching(gc)
	}
	return gc
}

// deliver hands a to Accept, or closes its connection and reports false
// once the listener is closed.
func (gl *Listener) deliver(a accepted) bool {
	select {
	case gl.accepted <- a:
		return true
	case <-gl.stop:
		if a.conn != nil {
			_ = a.conn.Close()
		}
		return false
	}
}

// admitLocked counts a new connection from host, or reports false if it
// would pass a cap. The caller holds hostMu.
func (gl *Listener) admitLocked(host string) bool {
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

func (gl *Listener) Close() error {
	gl.once.Do(func() { close(gl.stop) })
	err := gl.Listener.Close()
	gl.hostMu.Lock()
	for host, conns := range gl.line {
		for _, c := range conns {
			_ = c.Close()
		}
		delete(gl.line, host)
	}
	gl.lineTotal = 0
	gl.hostMu.Unlock()
	gl.releaseTarpit(true)
	return err
}

// sweep ticks once a second until Close.
func (gl *Listener) sweep() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-gl.stop:
			return
		case <-t.C:
			gl.tick()
		}
	}
}

// tick advances now, ends the cooldowns that are over, admits from the
// lines what may be admitted now (places on probation free with time, and
// a line whose cooldown ended is admitted whole), empties the tarpits of
// addresses whose cooldown ended, closes the connections holding a stream
// older than StreamWriteTimeout or a header block open for
// headerBlockTimeout, and refuses the streams overdue (streams.go).
func (gl *Listener) tick() {
	now := gl.clock()
	gl.now.Store(now.UnixNano())
	gl.banned.Range(func(k, v any) bool {
		if v.(int64) <= now.UnixNano() {
			gl.banned.Delete(k)
		}
		return true
	})
	gl.hostMu.Lock()
	hosts := make([]string, 0, len(gl.line))
	for host := range gl.line {
		hosts = append(hosts, host)
	}
	gl.hostMu.Unlock()
	for _, host := range hosts {
		gl.admitFromLine(host)
	}
	gl.vacatePlaces(now.UnixNano())
	gl.releaseTarpit(false)
	// Every connection is judged before any is cut or refused: a cut
	// gives its bytes back (in the background), which would spare the
	// address's other connections by chance of timing.
	type cut struct {
		c     *guardedConn
		event Event
	}
	var cuts []cut
	refusals := map[*guardedConn][]refusal{}
	ns := now.UnixNano()
	gl.conns.Range(func(k, _ any) bool {
		c := k.(*guardedConn)
		switch {
		case c.oldestWaiting() < now.Add(-gl.o.StreamWriteTimeout).UnixNano():
			cuts = append(cuts, cut{c, EventUnreadAnswers})
		case c.blockStalled(ns - int64(headerBlockTimeout)):
			cuts = append(cuts, cut{c, EventHeaderBlock})
		default:
			if rs := c.overdue(ns); len(rs) > 0 {
				refusals[c] = rs
			}
		}
		return true
	})
	for _, x := range cuts {
		x.c.goAway(x.event, false)
	}
	for c, rs := range refusals {
		c.refuse(rs)
	}
}
