package server

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/openrls/ratelimit/src/server/h2guard"
)

// HTTPLimits caps the connections of each HTTP listener (the HTTP port,
// the debug port and PROMETHEUS_ADDR, each on its own): in total
// (HTTP_MAX_CONNECTIONS) and per client address
// (HTTP_MAX_CONNECTIONS_PER_ADDRESS). Zero fields take defaultHTTPLimits'.
type HTTPLimits struct {
	MaxConnections, MaxConnectionsPerAddress int
}

// defaultHTTPLimits fit probes, scrapes and /json clients; an idle
// keep-alive connection gives way to a new one anyway (see capListener).
var defaultHTTPLimits = HTTPLimits{MaxConnections: 1024, MaxConnectionsPerAddress: 256}

func (l HTTPLimits) withDefaults() HTTPLimits {
	if l.MaxConnections <= 0 {
		l.MaxConnections = defaultHTTPLimits.MaxConnections
	}
	if l.MaxConnectionsPerAddress <= 0 {
		l.MaxConnectionsPerAddress = defaultHTTPLimits.MaxConnectionsPerAddress
	}
	return l
}

// Why an HTTP listener closed a connection of its own accord.
const (
	HTTPRefused     = "refused"      // at a cap, every connection busy
	HTTPEvictedIdle = "evicted_idle" // an idle keep-alive connection, for a new one
)

// capListener caps an HTTP listener's connections. Silent connections
// (accepted, and not yet a whole request's headers sent: nothing, or a
// request's first bytes and then nothing) and idle keep-alive ones
// give way: at a cap, a new connection closes the silent one accepted
// first, else the one idle longest (of its address, at the per-address
// cap), and takes its place, so that thousands of silent or idle
// connections cost a bounded number of descriptors and never keep a probe
// out, and a flood of silent ones does not push out the keep-alive
// connections of clients that use them. Only when every connection is busy
// (reading a request, bounded by the read timeouts, or answering) is a new
// one closed at once. The server's ConnState must be set to track.
type capListener struct {
	net.Listener
	l     HTTPLimits
	note  func(why string)
	mu    sync.Mutex
	conns map[*capConn]struct{}
	hosts map[string]int
}

type capConn struct {
	net.Conn
	cl   *capListener
	host string
	// idleSince is when the connection went idle between requests, or was
	// accepted while it is silent; zero while it reads or answers one
	// (guarded by cl.mu, as silent).
	idleSince time.Time
	// silent is set until the connection's first request is read whole
	// (net/http's StateActive comes after the headers, not the first
	// byte), so one that sends a byte and stops stays silent.
	silent bool
	closed atomic.Bool
}

func newCapListener(l net.Listener, lim HTTPLimits, note func(why string)) *capListener {
	return &capListener{Listener: l, l: lim.withDefaults(), note: note, conns: map[*capConn]struct{}{}, hosts: map[string]int{}}
}

func (cl *capListener) Accept() (net.Conn, error) {
	for {
		c, err := cl.Listener.Accept()
		if err != nil {
			return nil, err
		}
		cc := &capConn{Conn: c, cl: cl, host: h2guard.Host(c.RemoteAddr()), idleSince: time.Now(), silent: true}
		if cl.admit(cc) {
			return cc, nil
		}
		cl.note(HTTPRefused)
		_ = c.Close()
	}
}

// admit counts cc in, making room by evicting an idle connection where a
// cap is reached; it reports false when no room can be made.
func (cl *capListener) admit(cc *capConn) bool {
	cl.mu.Lock()
	var victims []*capConn
	ok := true
	if cl.hosts[cc.host] >= cl.l.MaxConnectionsPerAddress {
		if v := cl.idlest(cc.host); v != nil {
			victims = append(victims, v)
		} else {
			ok = false
		}
	}
	if ok && len(cl.conns)-len(victims) >= cl.l.MaxConnections {
		if v := cl.idlest(""); v != nil {
			victims = append(victims, v)
		} else {
			ok = false
		}
	}
	if ok {
		for _, v := range victims {
			cl.forgetLocked(v)
		}
		cl.conns[cc] = struct{}{}
		cl.hosts[cc.host]++
	} else {
		victims = nil
	}
	cl.mu.Unlock()
	for _, v := range victims {
		cl.note(HTTPEvictedIdle)
		_ = v.Conn.Close() // http.Server's goroutine for it sees the close and ends
	}
	return ok
}

// idlest returns the silent connection accepted first, else the one idle
// longest (of host, unless host is ""), or nil when none is silent or
// idle; cl.mu held.
func (cl *capListener) idlest(host string) *capConn {
	var best *capConn
	for c := range cl.conns {
		if c.idleSince.IsZero() || host != "" && c.host != host {
			continue
		}
		if best == nil || c.silent && !best.silent || c.silent == best.silent && c.idleSince.Before(best.idleSince) {
			best = c
		}
	}
	return best
}

// forgetLocked uncounts c and marks it closed; cl.mu held.
func (cl *capListener) forgetLocked(c *capConn) {
	if !c.closed.CompareAndSwap(false, true) {
		return
	}
	delete(cl.conns, c)
	if cl.hosts[c.host]--; cl.hosts[c.host] <= 0 {
		delete(cl.hosts, c.host)
	}
}

// connState tracks idleness for the listener's http.Server.
func (cl *capListener) connState(c net.Conn, st http.ConnState) {
	cc, ok := c.(*capConn)
	if !ok {
		return
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	switch st {
	case http.StateIdle:
		cc.idleSince = time.Now()
	case http.StateActive:
		cc.idleSince, cc.silent = time.Time{}, false
	case http.StateClosed, http.StateHijacked:
		cl.forgetLocked(cc)
	}
}

func (c *capConn) Close() error {
	c.cl.mu.Lock()
	c.cl.forgetLocked(c)
	c.cl.mu.Unlock()
	return c.Conn.Close()
}
