// Package h2guard guards a gRPC listener against one client taking it away
// from the others, below grpc-go: it caps connections (in all and per
// address), watches every connection's HTTP/2 frame headers (plaintext as
// accepted, TLS after the handshake) to cut rapid resets, connections
// whose answers are not read and header blocks past their size or time,
// refuses single streams past the bounds on streams without their request
// and on request bytes (streams.go, bodies.go), puts an abusing address on
// probation, and bounds the calls in flight.
package h2guard

import (
	"context"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
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
	// ResetsPerSecond; its further new connections wait in line, unanswered,
	// and are admitted in the order they came as places free (see
	// probation.go). Well-behaved clients that share the address (behind
	// one NAT or load balancer) keep connecting, and each connection an
	// attacker gets costs it a handshake per probationResets resets.
	// Connections it already holds are not touched.
	Cooldown time.Duration
	// Bytes is the request-byte budget (GRPC_MAX_REQUEST_BYTES_IN_FLIGHT)
	// that unfinished request messages count against, an address's at most
	// a quarter of it (see bodies.go).
	Bytes *Budget
}

// Default fits a mesh: thousands of Envoy connections, each with far
// fewer resets than calls, every call answered within seconds.
var Default = Options{MaxConnections: 10000, MaxConnectionsPerAddress: 1000, MaxInFlight: 10000, ResetsPerSecond: 200, StreamWriteTimeout: 30 * time.Second,
	Cooldown: 10 * time.Second}

// DefaultBytes is the size of the request-byte budget when Options.Bytes
// is nil.
const DefaultBytes = 64 << 20

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
	if g.Bytes == nil {
		g.Bytes = NewBudget(DefaultBytes)
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
	EventConnectionRefused Event = "connection_refused" // closed unserved: past a cap, or pushed out of a full line
	EventCallRefused       Event = "call_refused"       // past MaxInFlight
	EventRapidReset        Event = "rapid_reset"        // closed: too many resets
	EventUnreadAnswers     Event = "unread_answers"     // closed: a stream outlived StreamWriteTimeout
	// closed: on probation, gave its place to a new connection of its address
	EventProbationReplaced Event = "probation_replaced"
	// its address on probation with every place taken: it waits in line
	// (see probation.go)
	EventConnectionHeld Event = "connection_held"
	// closed while it waited in line: it reset a stream before it was
	// answered (see line.go)
	EventResetInLine Event = "reset_in_line"
	// stream refused: its unfinished request message would take its
	// address past its share of the request-byte budget while the budget
	// is over three quarters full, or held it past the share for slowBody
	// (see bodies.go)
	EventRequestBytes Event = "request_bytes"
	// stream refused: its unfinished request message would pass the
	// request-byte budget, full of others' (not held against its address)
	EventBudgetFull Event = "request_budget_full"
	// stream refused: a request message still unfinished 30 s after it
	// began
	EventStalledBody Event = "stalled_request_body"
	// stream refused: its address holds pendingPerAddress streams whose
	// request has not arrived (see streams.go)
	EventPendingStreams Event = "pending_streams"
	// stream refused: every address's such streams fill pendingInAll, and
	// its address holds pendingFloor or more (not held against it)
	EventPendingFull Event = "pending_streams_full"
	// stream refused: its request not whole pendingTimeout after its
	// HEADERS
	EventStalledRequest Event = "stalled_request"
	// closed: a header block past maxHeaderBlock bytes, or open for
	// headerBlockTimeout
	EventHeaderBlock Event = "header_block"
	// closed: refusalsToCut of its streams were refused for abuse
	EventRefusedStreams Event = "refused_streams"
)

// Events lists every event, for metrics.
var Events = []Event{EventConnectionRefused, EventCallRefused, EventRapidReset, EventUnreadAnswers, EventProbationReplaced,
	EventConnectionHeld, EventResetInLine, EventRequestBytes, EventBudgetFull, EventStalledBody, EventPendingStreams, EventPendingFull,
	EventStalledRequest, EventHeaderBlock, EventRefusedStreams}

// Stream reports whether e refuses one stream, its connection kept (else
// it closes, refuses or holds a connection, or refuses a call).
func (e Event) Stream() bool {
	switch e {
	case EventRequestBytes, EventBudgetFull, EventStalledBody, EventPendingStreams, EventPendingFull, EventStalledRequest:
		return true
	}
	return false
}

// abuse reports whether a connection closed, or a stream refused, for e
// was abusing the protocol: its address then cools down.
func (e Event) abuse() bool {
	return e != EventProbationReplaced && e != EventBudgetFull && e != EventPendingFull
}

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

// Host is what the caps and probation count a peer by: a TCP peer's IP,
// or "" for a Unix socket's peer (the HTTP listeners count by it too).
func Host(addr net.Addr) string {
	if a, ok := addr.(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return ""
}
