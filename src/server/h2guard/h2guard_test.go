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
			fr.feed(rest[:n], func(typ, flags byte, stream uint32) bool { got = append(got, frame{typ, flags, stream}); return false }, nil)
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

// probationRig is a listener on a fake clock with its address cooling
// down, and what its tests drive it with.
type probationRig struct {
	t        *testing.T
	gl       *Listener
	addr     string
	clock    *atomic.Int64
	events   chan Event
	accepted chan *guardedConn
}

func newProbationRig(t *testing.T) *probationRig {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &probationRig{t: t, addr: l.Addr().String(), clock: new(atomic.Int64), events: make(chan Event, 256),
		accepted: make(chan *guardedConn, 64)}
	r.clock.Store(time.Unix(1_700_000_000, 0).UnixNano())
	r.gl = newListener(l, Options{Cooldown: time.Hour}.WithDefaults(), true, func(e Event) { r.events <- e },
		func() time.Time { return time.Unix(0, r.clock.Load()) })
	t.Cleanup(func() { r.gl.Close() })
	r.gl.ban(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	go func() {
		for {
			c, err := r.gl.Accept()
			if err != nil {
				return
			}
			r.accepted <- c.(*guardedConn)
		}
	}()
	return r
}

// advance moves the clock, and the coarse clock streams are stamped with.
func (r *probationRig) advance(d time.Duration) { r.gl.now.Store(r.clock.Add(int64(d))) }

// next is the next connection admitted, and event the next event: a
// minute is far beyond what either takes, so that a guard that holds what
// it should admit fails the test rather than hanging it.
func (r *probationRig) next() *guardedConn {
	r.t.Helper()
	select {
	case c := <-r.accepted:
		return c
	case <-time.After(time.Minute):
		r.t.Fatal("no connection admitted")
		return nil
	}
}

func (r *probationRig) event() Event {
	r.t.Helper()
	select {
	case e := <-r.events:
		return e
	case <-time.After(time.Minute):
		r.t.Fatal("no guard event")
		return ""
	}
}

// events takes the next n events, sorted: which of them comes first may
// depend on whether the sweeper or a new connection admitted from a line.
func (r *probationRig) eventsN(n int) []Event {
	r.t.Helper()
	var got []Event
	for range n {
		got = append(got, r.event())
	}
	slices.Sort(got)
	return got
}

func (r *probationRig) dial() net.Conn {
	r.t.Helper()
	c, err := net.Dial("tcp", r.addr)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { c.Close() })
	return c
}

// admitted takes the next n connections admitted and checks that they
// are the server's side of clients, in any order.
func (r *probationRig) admitted(clients ...net.Conn) []*guardedConn {
	r.t.Helper()
	want := map[string]bool{}
	for _, c := range clients {
		want[c.LocalAddr().String()] = true
	}
	var got []*guardedConn
	for range clients {
		gc := r.next()
		if !want[gc.RemoteAddr().String()] {
			r.t.Fatalf("admitted %v, want one of %v", gc.RemoteAddr(), want)
		}
		delete(want, gc.RemoteAddr().String())
		gc.in.preface = 0
		got = append(got, gc)
	}
	return got
}

// frames feeds gc's client frames of the given types on stream id.
func frames(gc *guardedConn, id uint32, types ...byte) {
	var b []byte
	for _, typ := range types {
		f := make([]byte, frameHeader)
		f[3] = typ
		binary.BigEndian.PutUint32(f[5:], id)
		b = append(b, f...)
	}
	gc.in.feed(b, gc.inbound, gc.inboundData)
}

// closedByServer reports whether the server closed c, having sent it
// nothing but perhaps a GOAWAY, which it returns.
func closedByServer(t *testing.T, c net.Conn) []byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	b, err := io.ReadAll(c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("%v is still open, want it closed by the server", c.LocalAddr())
	}
	return b
}

// TestProbation: while an address cools down after an abuse, it holds at
// most probationConns connections; a new one beyond them waits in line
// until one of them resets a stream or opens none for quietFor, which then
// gives its place (GOAWAY) to the first in line; and such a connection is
// closed after probationResets resets in a second instead of
// ResetsPerSecond, its place held for abuseHoldsPlace.
func TestProbation(t *testing.T) {
	r := newProbationRig(t)
	var clients []net.Conn
	for range probationConns {
		clients = append(clients, r.dial())
	}
	conns := r.admitted(clients...)
	for _, gc := range conns {
		if !gc.probation {
			t.Fatal("a connection from a cooling address is not on probation")
		}
	}
	client := map[*guardedConn]net.Conn{}
	for _, c := range clients {
		for _, gc := range conns {
			if gc.RemoteAddr().String() == c.LocalAddr().String() {
				client[gc] = c
			}
		}
	}
	// All places taken by connections that just came: the next waits.
	a := r.dial()
	if e := r.event(); e != EventConnectionHeld {
		t.Fatalf("a connection past %d on probation: event %q, want it held (%q)", probationConns, e, EventConnectionHeld)
	}
	// Every one of them calls; one also resets a stream: it gives its
	// place, with a GOAWAY, to the first in line, not to a later dial.
	r.advance(time.Second)
	for _, gc := range conns {
		frames(gc, 1, frameHeaders)
	}
	frames(conns[2], 1, frameRST)
	b := r.dial()
	ga := r.admitted(a)[0]
	if !ga.probation {
		t.Error("the connection admitted in place of a resetting one is not on probation")
	}
	if got, want := r.eventsN(2), []Event{EventConnectionHeld, EventProbationReplaced}; !slices.Equal(got, want) {
		t.Errorf("a place given way while a second dial came: events %q, want %q", got, want)
	}
	if got := closedByServer(t, client[conns[2]]); len(got) < frameHeader || got[3] != frameGoAway {
		t.Errorf("the resetting connection read %x, want a GOAWAY", got)
	}
	// Within quietFor of their last stream, the others keep their places,
	// and b waits.
	r.advance(quietFor - time.Second)
	r.gl.tick()
	select {
	case gc := <-r.accepted:
		t.Fatalf("%v admitted while every place was in use", gc.RemoteAddr())
	default:
	}
	// Two keep calling; the third and a opened nothing for quietFor: their
	// places go to b and the next dial. Giving way is no abuse: the
	// cooldown is not renewed by it.
	r.advance(time.Second)
	frames(conns[0], 3, frameHeaders)
	frames(conns[1], 3, frameHeaders)
	until, _ := r.gl.banned.Load("127.0.0.1")
	c := r.dial()
	r.admitted(b, c)
	if got, want := r.eventsN(2), []Event{EventProbationReplaced, EventProbationReplaced}; !slices.Equal(got, want) {
		t.Errorf("two quiet connections: events %q, want %q", got, want)
	}
	if again, _ := r.gl.banned.Load("127.0.0.1"); again != until {
		t.Error("a connection giving its place renewed the address's cooldown")
	}
	// Streams opened and reset: the eleventh reset in the second cuts.
	gc := conns[0]
	r.advance(time.Second)
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
	if e := r.event(); e != EventRapidReset {
		t.Fatalf("the resetting connection: event %q, want %q", e, EventRapidReset)
	}
	// A connection cut for abuse keeps its place for abuseHoldsPlace: the
	// next dial waits, and is admitted once that has passed.
	d := r.dial()
	if e := r.event(); e != EventConnectionHeld {
		t.Fatalf("a dial while the place of one cut for abuse is held: event %q, want %q", e, EventConnectionHeld)
	}
	r.advance(abuseHoldsPlace - time.Nanosecond)
	r.gl.tick()
	select {
	case gc := <-r.accepted:
		t.Fatalf("%v admitted to a place held after abuse", gc.RemoteAddr())
	default:
	}
	r.advance(time.Nanosecond)
	r.gl.tick()
	r.admitted(d)
}

// TestProbationLine: a cooling address's line holds linePerHost
// connections; a further one pushes out the longest-waiting; when the
// cooldown ends, the line is admitted whole, off probation.
func TestProbationLine(t *testing.T) {
	r := newProbationRig(t)
	var places []net.Conn
	for range probationConns {
		places = append(places, r.dial())
	}
	r.admitted(places...)
	var line []net.Conn
	for range linePerHost {
		line = append(line, r.dial())
		if e := r.event(); e != EventConnectionHeld {
			t.Fatalf("connection %d in line: event %q, want %q", len(line), e, EventConnectionHeld)
		}
	}
	line = append(line, r.dial())
	if got, want := r.eventsN(2), []Event{EventConnectionHeld, EventConnectionRefused}; !slices.Equal(got, want) {
		t.Errorf("one past a full line: events %q, want %q", got, want)
	}
	if got := closedByServer(t, line[0]); len(got) != 0 {
		t.Errorf("the longest-waiting connection read %x, want nothing", got)
	}
	r.advance(time.Hour)
	r.gl.tick()
	for _, gc := range r.admitted(line[1:]...) {
		if gc.probation {
			t.Errorf("%v admitted after the cooldown is on probation", gc.RemoteAddr())
		}
	}
}

// TestLineReadsWhileWaiting: what a client in line sends is read and,
// once it is admitted, replayed to gRPC, frames watched; a client that
// resets a stream before it was answered leaves the line at once for the
// tarpit (until the cooldown ends), and its address's cooldown starts
// anew; one that closes leaves the line.
func TestLineReadsWhileWaiting(t *testing.T) {
	r := newProbationRig(t)
	var places []net.Conn
	for range probationConns {
		places = append(places, r.dial())
	}
	r.admitted(places...)
	frame := func(typ byte, stream uint32) []byte {
		f := make([]byte, frameHeader)
		f[3] = typ
		binary.BigEndian.PutUint32(f[5:], stream)
		return f
	}
	hello := append([]byte(clientPreface), frame(0x4, 0)...) // SETTINGS
	sent := append(slices.Clone(hello), frame(frameHeaders, 1)...)
	a := r.dial()
	if _, err := a.Write(sent); err != nil {
		t.Fatal(err)
	}
	if e := r.event(); e != EventConnectionHeld {
		t.Fatalf("a dial past the places: event %q, want %q", e, EventConnectionHeld)
	}
	r.advance(time.Second)
	until, _ := r.gl.banned.Load("127.0.0.1")
	b := r.dial()
	if _, err := b.Write(append(append(slices.Clone(hello), frame(frameHeaders, 1)...), frame(frameRST, 1)...)); err != nil {
		t.Fatal(err)
	}
	if got, want := r.eventsN(2), []Event{EventConnectionHeld, EventResetInLine}; !slices.Equal(got, want) {
		t.Errorf("a dial that resets a stream in line: events %q, want %q", got, want)
	}
	if again, _ := r.gl.banned.Load("127.0.0.1"); again == until {
		t.Error("a reset in line did not renew the address's cooldown")
	}
	r.gl.hostMu.Lock()
	held := len(r.gl.tarpit["127.0.0.1"])
	r.gl.hostMu.Unlock()
	if held != 1 {
		t.Errorf("%d connections in the tarpit after a reset in line, want 1", held)
	}
	c := r.dial()
	if e := r.event(); e != EventConnectionHeld {
		t.Fatalf("a third dial: event %q, want %q", e, EventConnectionHeld)
	}
	c.Close()
	inLine := func() int {
		r.gl.hostMu.Lock()
		defer r.gl.hostMu.Unlock()
		return len(r.gl.line["127.0.0.1"])
	}
	for end := time.Now().Add(time.Minute); inLine() != 1; {
		if time.Now().After(end) {
			t.Fatalf("%d in line a minute after one of two closed, want 1", inLine())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The places go quiet: a is admitted, and gRPC reads what it sent.
	r.advance(quietFor)
	r.gl.tick()
	gc := r.next()
	if gc.RemoteAddr().String() != a.LocalAddr().String() {
		t.Fatalf("admitted %v, want a (%v)", gc.RemoteAddr(), a.LocalAddr())
	}
	got := make([]byte, len(sent))
	if _, err := io.ReadFull(gc, got); err != nil || !slices.Equal(got, sent) {
		t.Errorf("gRPC read %x (%v), want what a sent while it waited, %x", got, err, sent)
	}
	if gc.last != 1 {
		t.Errorf("the guard saw stream %d of the replayed frames, want 1", gc.last)
	}
	// When the cooldown ends, the tarpit lets go of the resetting dial.
	r.advance(time.Hour)
	r.gl.tick()
	if got := closedByServer(t, b); len(got) != 0 {
		t.Errorf("the resetting dial read %x, want nothing", got)
	}
}

// TestProbationLinesInAll: past lineTotal connections in all lines, a new
// one of a cooling address is closed at once.
func TestProbationLinesInAll(t *testing.T) {
	r := newProbationRig(t)
	var places []net.Conn
	for range probationConns {
		places = append(places, r.dial())
	}
	r.admitted(places...)
	r.gl.hostMu.Lock()
	r.gl.lineTotal = lineTotal // as if other addresses' lines held that many
	r.gl.hostMu.Unlock()
	c := r.dial()
	if e := r.event(); e != EventConnectionRefused {
		t.Errorf("a connection past %d in all lines: event %q, want %q", lineTotal, e, EventConnectionRefused)
	}
	if got := closedByServer(t, c); len(got) != 0 {
		t.Errorf("it read %x, want nothing", got)
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
			c.in.feed(frames, c.inbound, c.inboundData)
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

// TestConnectionCaps: admitLocked counts connections in all and per address,
// refuses past either cap, and release makes room again.
func TestConnectionCaps(t *testing.T) {
	gl := &Listener{o: Options{MaxConnections: 3, MaxConnectionsPerAddress: 2}, perHost: map[string]int{}}
	for i, tc := range []struct {
		host string
		want bool
	}{{"a", true}, {"a", true}, {"a", false}, {"b", true}, {"c", false}} {
		if got := gl.admitLocked(tc.host); got != tc.want {
			t.Errorf("admit %d (%s) = %v, want %v", i, tc.host, got, tc.want)
		}
	}
	gl.release("a")
	if !gl.admitLocked("c") {
		t.Error("no room after a release")
	}
}

// discardConn is a net.Conn that takes every write.
type discardConn struct{ net.Conn }

func (discardConn) Write(b []byte) (int, error)      { return len(b), nil }
func (discardConn) Close() error                     { return nil }
func (discardConn) SetWriteDeadline(time.Time) error { return nil }
func (discardConn) SetReadDeadline(time.Time) error  { return nil }
func (discardConn) RemoteAddr() net.Addr             { return &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1)} }
