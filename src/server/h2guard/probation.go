package h2guard

import (
	"net"
	"slices"
	"time"
)

// Probation. After one of its connections was closed for abuse, an
// address cools down for Options.Cooldown. Meanwhile its new connections
// are not turned away, since well-behaved clients may share the address
// (one NAT or load balancer) with the attacker, but none of them is
// admitted beyond probationConns places, and each admitted one is closed
// after probationResets resets in a second.
//
// A new connection that finds every place taken waits in its address's
// line (see line.go), and the line is admitted in the order it came as
// places free: a place frees when its connection closes, resets a stream
// (within suspectFor, it behaves like an attacker's: it is sent GOAWAY and
// gives its place), or holds it unused (no stream within quietFor).
// Places go in turn, not to whoever dials most. Each connection an
// attacker does get costs it a handshake per probationResets resets.
//
// A connection cut for abuse keeps its place, closed, for abuseHoldsPlace
// (to the sweeper's next tick past it): otherwise an attacker with a dial
// for each place churns through them, a handshake and probationResets
// handlers each, as fast as this process can cut them, and its cost falls
// on everyone this process serves. Held, its places yield at most
// probationConns connections per abuseHoldsPlace.
const (
	probationConns  = 4
	probationResets = 10
	suspectFor      = 2 * time.Second
	quietFor        = 5 * time.Second
	abuseHoldsPlace = time.Second
)

// placeLocked returns the place on probation a new connection of host
// takes at now (ns): len of its connections when one is free, else the
// index of the first that gives way, else -1. The caller holds hostMu.
func (gl *Listener) placeLocked(host string, now int64) int {
	conns := gl.probation[host]
	if len(conns) < probationConns {
		return len(conns)
	}
	return slices.IndexFunc(conns, func(c *guardedConn) bool { return c.givesWay(now) })
}

// settle closes what admitLineLocked refused, and ends the connections
// that gave their places: with a GOAWAY once past the TLS handshake
// (under TLS, on the decrypted connection), else simply closed.
func (gl *Listener) settle(evicted []*guardedConn, refused []net.Conn) {
	for _, c := range refused {
		gl.note(EventConnectionRefused)
		_ = c.Close()
	}
	for _, gc := range evicted {
		if w := gc.watcher.Load(); w != nil {
			w.goAway(EventProbationReplaced, false)
		} else {
			gl.note(EventProbationReplaced)
			_ = gc.Close()
		}
	}
}

// leaveProbation forgets gc, closed, among its address's probation
// connections; its place goes to the line, unless gc was cut for abuse:
// then the place stays held until abuseHoldsPlace has passed.
func (gl *Listener) leaveProbation(gc *guardedConn) {
	w := gc.watcher.Load()
	abused := w != nil && w.cutForAbuse()
	gl.hostMu.Lock()
	conns := gl.probation[gc.host]
	i := slices.Index(conns, gc)
	switch {
	case i >= 0 && abused:
		gc.vacatesAt = gl.clock().Add(abuseHoldsPlace).UnixNano()
	case i >= 0:
		gl.dropPlaceLocked(gc.host, i)
	}
	waiting := len(gl.line[gc.host]) > 0
	gl.hostMu.Unlock()
	// One that gave its place is no longer among them: the place went
	// to the line already.
	if i >= 0 && !abused && waiting {
		gl.admitFromLine(gc.host)
	}
}

// dropPlaceLocked removes host's i-th place on probation. The caller
// holds hostMu.
func (gl *Listener) dropPlaceLocked(host string, i int) {
	if conns := slices.Delete(gl.probation[host], i, i+1); len(conns) > 0 {
		gl.probation[host] = conns
	} else {
		delete(gl.probation, host)
	}
}

// vacatePlaces frees, at now (ns), the places held after abuse whose
// time has passed, of addresses with no line (a line takes them itself).
func (gl *Listener) vacatePlaces(now int64) {
	gl.hostMu.Lock()
	defer gl.hostMu.Unlock()
	for host, conns := range gl.probation {
		if len(gl.line[host]) > 0 {
			continue
		}
		for i := len(conns) - 1; i >= 0; i-- {
			if c := conns[i]; c.closed.Load() && now >= c.vacatesAt {
				gl.dropPlaceLocked(host, i)
			}
		}
	}
}

// givesWay reports whether c, a connection on probation, gives its place
// to a new one at now (ns): it reset a stream within suspectFor, or opened
// none within quietFor (counted from its admission when it opened none);
// or, cut for abuse, its place is held no longer. The caller holds hostMu.
func (c *guardedConn) givesWay(now int64) bool {
	if c.closed.Load() {
		return now >= c.vacatesAt
	}
	w := c.watcher.Load()
	if w == nil { // a TLS handshake in progress
		return now-c.admittedAt >= int64(quietFor)
	}
	lastStream := max(w.lastStream.Load(), c.admittedAt)
	return now-w.lastReset.Load() < int64(suspectFor) || now-lastStream >= int64(quietFor)
}

// cooling reports whether addr's host is in its cooldown after an abuse.
func (gl *Listener) cooling(addr net.Addr) bool { return gl.coolingHost(Host(addr)) }

// coolingHost reports whether host is in its cooldown after an abuse.
func (gl *Listener) coolingHost(host string) bool {
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
