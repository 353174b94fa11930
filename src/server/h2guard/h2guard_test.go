package h2guard

import (
	"context"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestInFlightLimit(t *testing.T) {
	var events []Event
	limit := InFlightLimit(1, func(e Event) { events = append(events, e) })
	release, entered := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := limit(context.Background(), nil, &grpc.UnaryServerInfo{}, func(context.Context, any) (any, error) {
			close(entered)
			<-release
			return "ok", nil
		})
		done <- err
	}()
	<-entered
	_, err := limit(context.Background(), nil, &grpc.UnaryServerInfo{}, func(context.Context, any) (any, error) { return "ok", nil })
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a call past the bound = %v, want ResourceExhausted", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := limit(context.Background(), nil, &grpc.UnaryServerInfo{}, func(context.Context, any) (any, error) { return "ok", nil }); err != nil {
		t.Errorf("a call once the first ended = %v", err)
	}
	if !slices.Equal(events, []Event{EventCallRefused}) {
		t.Errorf("events = %v, want one refusal", events)
	}
}

// TestFrameReader: frame headers are found whatever the chunks the bytes
// arrive in, payloads skipped.
func TestFrameReader(t *testing.T) {
	type frame struct {
		typ, flags byte
		stream     uint32
	}
	want := []frame{{4, 0, 0}, {1, 4, 1}, {0, 1, 1}, {3, 0, 3}, {7, 0, 0}, {1, 5, 5}}
	wire := []byte(clientPreface)
	for i, f := range want {
		payload := make([]byte, i*37)
		var h [frameHeader]byte
		h[0], h[1], h[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
		h[3], h[4] = f.typ, f.flags
		binary.BigEndian.PutUint32(h[5:], f.stream|1<<31) // the reserved bit is ignored
		wire = append(append(wire, h[:]...), payload...)
	}
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 1))
		fr := frameReader{preface: len(clientPreface)}
		var got []frame
		for rest := wire; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(20))
			fr.feed(rest[:n], func(typ, flags byte, stream uint32) bool { got = append(got, frame{typ, flags, stream}); return false })
			rest = rest[n:]
		}
		if !slices.Equal(got, want) || !fr.atBoundary() {
			t.Fatalf("seed %d: frames %v (at boundary %v), want %v", seed, got, fr.atBoundary(), want)
		}
	}
}

// TestSlowReaderDoesNotStallTheSweeper: a write blocked on a peer that
// never reads holds no lock the sweeper needs, so the sweeper still closes
// another connection whose answer is not read, and a GOAWAY for the
// blocked connection is decided without waiting for its write.
func TestSlowReaderDoesNotStallTheSweeper(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan Event, 8)
	gl := NewListener(l, Options{StreamWriteTimeout: time.Second}.WithDefaults(), true, func(e Event) { events <- e })
	defer gl.Close()
	accept := func() (server *guardedConn, client net.Conn) {
		t.Helper()
		client, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		c, err := gl.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return c.(*guardedConn), client
	}

	// A: the server writes far more than the socket buffers hold; the
	// client never reads, so the write blocks.
	slow, _ := accept()
	blocked := make(chan error, 1)
	go func() {
		_, err := slow.Write(make([]byte, 256<<20))
		blocked <- err
	}()

	// B: an answer's headers went out (stream 1, no END_STREAM) and its
	// message never follows.
	idle, idleClient := accept()
	headers := make([]byte, frameHeader)
	headers[3] = frameHeaders
	binary.BigEndian.PutUint32(headers[5:], 1)
	if _, err := idle.Write(headers); err != nil {
		t.Fatal(err)
	}
	// The sweeper closes B, with a GOAWAY, while A's write still blocks.
	_ = idleClient.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(idleClient)
	if len(got) < 2*frameHeader || got[frameHeader+3] != frameGoAway {
		t.Fatalf("B read %d bytes (%v), want its headers then a GOAWAY", len(got), err)
	}
	if e := <-events; e != EventUnreadAnswers {
		t.Errorf("event %q, want %q", e, EventUnreadAnswers)
	}
	select {
	case err := <-blocked:
		t.Fatalf("A's write ended (%v): the test needs it blocked", err)
	default:
	}
	// A GOAWAY decided for A returns at once and ends A's write.
	slow.goAway(EventRapidReset, false)
	if err := <-blocked; err == nil {
		t.Error("A's blocked write succeeded after its connection was closed")
	}
}

// TestProbation: while an address cools down after an abuse, it holds at
// most probationConns connections; a new one beyond them is held, unless
// one of them reset a stream lately or opened none for quietFor, which
// then gives its place (GOAWAY) to the new one; and such a connection is
// closed after probationResets resets in a second instead of
// ResetsPerSecond.
func TestProbation(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var clock atomic.Int64
	clock.Store(time.Unix(1_700_000_000, 0).UnixNano())
	events := make(chan Event, 64)
	gl := newListener(l, Options{Cooldown: time.Hour}.WithDefaults(), true, func(e Event) { events <- e },
		func() time.Time { return time.Unix(0, clock.Load()) })
	defer gl.Close()
	advance := func(d time.Duration) { gl.now.Store(clock.Add(int64(d))) }
	gl.ban(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	accepted := make(chan *guardedConn, 8)
	go func() {
		for {
			c, err := gl.Accept()
			if err != nil {
				return
			}
			accepted <- c.(*guardedConn)
		}
	}()
	// next is the next connection admitted, and event the next event: a
	// minute is far beyond what either takes, so that a guard that holds
	// what it should admit fails the test rather than hanging it.
	next := func() *guardedConn {
		t.Helper()
		select {
		case c := <-accepted:
			return c
		case <-time.After(time.Minute):
			t.Fatal("no connection admitted")
			return nil
		}
	}
	event := func() Event {
		t.Helper()
		select {
		case e := <-events:
			return e
		case <-time.After(time.Minute):
			t.Fatal("no guard event")
			return ""
		}
	}
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// frames feeds gc's client frames of the given types on stream id.
	frames := func(gc *guardedConn, id uint32, types ...byte) {
		var b []byte
		for _, typ := range types {
			f := make([]byte, frameHeader)
			f[3] = typ
			binary.BigEndian.PutUint32(f[5:], id)
			b = append(b, f...)
		}
		gc.in.feed(b, gc.inbound)
	}
	var conns []*guardedConn
	clients := map[*guardedConn]net.Conn{}
	for range probationConns {
		client := dial()
		gc := next()
		if !gc.probation {
			t.Fatal("a connection from a cooling address is not on probation")
		}
		gc.in.preface = 0
		conns = append(conns, gc)
		clients[gc] = client
	}
	// All places taken by connections that just came: the next is held.
	dial()
	if e := event(); e != EventConnectionRefused {
		t.Fatalf("a connection past %d on probation: event %q, want it held (%q)", probationConns, e, EventConnectionRefused)
	}
	// Every one of them calls; one also resets a stream: it gives its
	// place to the next connection, with a GOAWAY.
	advance(time.Second)
	for _, gc := range conns {
		frames(gc, 1, frameHeaders)
	}
	frames(conns[2], 1, frameRST)
	dial()
	if got := next(); !got.probation {
		t.Error("the connection admitted in place of a resetting one is not on probation")
	}
	if e := event(); e != EventProbationReplaced {
		t.Errorf("the resetting connection: event %q, want %q", e, EventProbationReplaced)
	}
	if b, _ := io.ReadAll(clients[conns[2]]); len(b) < frameHeader || b[3] != frameGoAway {
		t.Errorf("the resetting connection read %x, want a GOAWAY", b)
	}
	// Within quietFor of their last stream, the others keep their places.
	advance(quietFor - time.Second)
	dial()
	if e := event(); e != EventConnectionRefused {
		t.Fatalf("with every place in use: event %q, want the new connection held", e)
	}
	// Two keep calling; the third opened nothing for quietFor: its place
	// goes to the next connection. Giving way is no abuse: the cooldown
	// is not renewed by it.
	advance(time.Second)
	frames(conns[0], 3, frameHeaders)
	frames(conns[1], 3, frameHeaders)
	until, _ := gl.banned.Load("127.0.0.1")
	dial()
	next()
	if e := event(); e != EventProbationReplaced {
		t.Errorf("the quiet connection: event %q, want %q", e, EventProbationReplaced)
	}
	if again, _ := gl.banned.Load("127.0.0.1"); again != until {
		t.Error("a connection giving its place renewed the address's cooldown")
	}
	// Streams opened and reset: the eleventh reset in the second cuts.
	gc := conns[0]
	advance(time.Second)
	cut := -1
	for i := range 20 {
		frames(gc, uint32(2*i+101), frameHeaders, frameRST)
		if gc.cut.Load() {
			cut = i + 1
			break
		}
	}
	if cut != probationResets+1 {
		t.Errorf("cut after %d resets, want %d", cut, probationResets+1)
	}
}

// TestRapidReset: a connection is cut when, within a second, it resets more
// than ResetsPerSecond streams and more than half of those it opened; a
// client that opens many streams and cancels some is not.
func TestRapidReset(t *testing.T) {
	for _, tc := range []struct {
		name           string
		opened, resets int
		cut            bool
	}{
		{"resets past the limit, most of what it opened", 60, 60, true},
		{"resets at the limit", 50, 50, false},
		{"many calls, some cancelled", 200, 60, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gl := &Listener{o: Options{ResetsPerSecond: 50}.WithDefaults(), note: func(Event) {}, banned: sync.Map{}, clock: time.Now}
			c := &guardedConn{Conn: discardConn{}, gl: gl, watch: true, waiting: map[uint32]int64{}}
			var frames []byte
			frame := func(typ byte, stream uint32) {
				f := make([]byte, frameHeader)
				f[3] = typ
				binary.BigEndian.PutUint32(f[5:], stream)
				frames = append(frames, f...)
			}
			// Streams opened first, then some reset: the habit of a
			// client that cancels now and then, not one that resets what
			// it opens as it opens it.
			for i := range tc.opened {
				frame(frameHeaders, uint32(2*i+1))
			}
			for i := range tc.resets {
				frame(frameRST, uint32(2*i+1))
			}
			c.in.feed(frames, c.inbound)
			if got := c.cut.Load(); got != tc.cut {
				t.Errorf("%d opened, %d reset: cut %v, want %v", tc.opened, tc.resets, got, tc.cut)
			}
		})
	}
}

// TestCooldownEnds: an address banned for abuse cools down for Cooldown,
// and is then like any other.
func TestCooldownEnds(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	gl := &Listener{o: Options{Cooldown: 10 * time.Second}.WithDefaults(), clock: func() time.Time { return now }}
	addr := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 1234}
	other := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 8), Port: 1234}
	gl.ban(addr)
	if !gl.cooling(addr) || gl.cooling(other) {
		t.Fatal("a banned address does not cool down, or another does")
	}
	now = now.Add(10*time.Second - time.Nanosecond)
	if !gl.cooling(addr) {
		t.Error("the cooldown ended early")
	}
	now = now.Add(time.Nanosecond)
	if gl.cooling(addr) {
		t.Error("the cooldown did not end")
	}
	// A Unix socket's peers share one empty address: none is banned.
	gl.ban(&net.UnixAddr{Name: "@", Net: "unix"})
	if gl.cooling(&net.UnixAddr{Name: "@", Net: "unix"}) {
		t.Error("a Unix socket peer was banned")
	}
}

// TestConnectionCaps: admit counts connections in all and per address,
// refuses past either cap, and release makes room again.
func TestConnectionCaps(t *testing.T) {
	gl := &Listener{o: Options{MaxConnections: 3, MaxConnectionsPerAddress: 2}, perHost: map[string]int{}}
	for i, tc := range []struct {
		host string
		want bool
	}{{"a", true}, {"a", true}, {"a", false}, {"b", true}, {"c", false}} {
		if got := gl.admit(tc.host); got != tc.want {
			t.Errorf("admit %d (%s) = %v, want %v", i, tc.host, got, tc.want)
		}
	}
	gl.release("a")
	if !gl.admit("c") {
		t.Error("no room after a release")
	}
}

// discardConn is a net.Conn that takes every write.
type discardConn struct{ net.Conn }

func (discardConn) Write(b []byte) (int, error)      { return len(b), nil }
func (discardConn) Close() error                     { return nil }
func (discardConn) SetWriteDeadline(time.Time) error { return nil }
func (discardConn) RemoteAddr() net.Addr             { return &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1)} }
