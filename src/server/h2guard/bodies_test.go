package h2guard

import (
	"encoding/binary"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"testing"
	"time"
)

// bodyRig is a watched connection from one address, fed the client's
// frames by hand, with a listener whose budget is budget bytes.
type bodyRig struct {
	gl     *Listener
	c      *guardedConn
	events []Event
	mu     sync.Mutex
	now    time.Time
}

func newBodyRig(budget int64) *bodyRig {
	r := &bodyRig{now: time.Unix(1_700_000_000, 0)}
	r.gl = &Listener{o: Options{Bytes: NewBudget(budget)}.WithDefaults(), shares: map[string]*share{},
		clock: func() time.Time { return r.now }, note: func(e Event) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.events = append(r.events, e)
		}}
	r.gl.now.Store(r.now.UnixNano())
	r.c = r.conn()
	return r
}

// conn is another connection from the rig's address.
func (r *bodyRig) conn() *guardedConn {
	c := &guardedConn{Conn: discardConn{}, gl: r.gl, watch: true, waiting: map[uint32]int64{}, host: "192.0.2.1",
		done: make(chan struct{}), resetsAfter: -1}
	c.share = r.gl.joinShare(c.host)
	return c
}

func (r *bodyRig) eventList() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// grpcMessage is a gRPC message of n bytes: its prefix, then the bytes.
func grpcMessage(n int) []byte {
	m := make([]byte, prefixLen+n)
	binary.BigEndian.PutUint32(m[1:], uint32(n))
	return m
}

// dataFrame is a DATA frame on stream carrying payload, padded with pad
// bytes when pad >= 0.
func dataFrame(stream uint32, flags byte, payload []byte, pad int) []byte {
	body := payload
	if pad >= 0 {
		flags |= flagPadded
		body = append(append([]byte{byte(pad)}, payload...), make([]byte, pad)...)
	}
	f := make([]byte, frameHeader, frameHeader+len(body))
	f[0], f[1], f[2] = byte(len(body)>>16), byte(len(body)>>8), byte(len(body))
	f[3], f[4] = frameData, flags
	binary.BigEndian.PutUint32(f[5:], stream)
	return append(f, body...)
}

// feedChunks feeds wire to c in chunks of random sizes (seed), as reads
// return them, and reports whether c was cut.
func feedChunks(c *guardedConn, wire []byte, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 2))
	for len(wire) > 0 && !c.cut.Load() {
		n := min(len(wire), 1+rng.IntN(40))
		c.in.feed(wire[:n], c.inbound, c.inboundData)
		wire = wire[n:]
	}
}

// TestBodiesHeld: the bytes of a message still unfinished at the end of a
// DATA frame, and its record's messageCost, are counted against the budget
// and the address's share,
// whatever the chunks the frames arrive in and however they are padded, and
// given back when the message ends or its stream does.
func TestBodiesHeld(t *testing.T) {
	msg := grpcMessage(1000)
	for _, tc := range []struct {
		name string
		wire []byte
		want int64 // held once the wire is read
	}{
		{"whole in one frame", dataFrame(1, flagEndStream, msg, -1), 0},
		{"two whole messages in one frame", dataFrame(1, 0, append(slices.Clone(msg), msg...), -1), 0},
		{"half of it", dataFrame(1, 0, msg[:505], -1), 505 + messageCost},
		{"half, padded", dataFrame(1, 0, msg[:505], 30), 505 + messageCost},
		{"in two frames", append(dataFrame(1, 0, msg[:505], -1), dataFrame(1, 0, msg[505:], 7)...), 0},
		{"a prefix split across frames", append(dataFrame(1, 0, msg[:3], -1), dataFrame(1, 0, msg[3:10], -1)...), 10 + messageCost},
		{"half, then the stream ends", append(dataFrame(1, 0, msg[:505], -1), dataFrame(1, flagEndStream, nil, -1)...), 0},
		{"half, then the client resets", append(dataFrame(1, 0, msg[:505], -1), rawFrame(frameRST, 0, 1)...), 0},
		{"half, then trailers", append(dataFrame(1, 0, msg[:505], -1), rawFrame(frameHeaders, flagEndStream, 1)...), 0},
		{"two streams, half each", append(dataFrame(1, 0, msg[:100], -1), dataFrame(3, 0, msg[:200], 0)...), 300 + 2*messageCost},
		{"a whole one after an unfinished one", append(dataFrame(1, 0, append(slices.Clone(msg), msg[:50]...), -1),
			dataFrame(3, flagEndStream, msg, -1)...), 50 + messageCost},
		{"an empty message", dataFrame(1, 0, grpcMessage(0), -1), 0},
	} {
		for seed := range uint64(20) {
			r := newBodyRig(1 << 20)
			feedChunks(r.c, tc.wire, seed)
			if got := r.gl.o.Bytes.Used(); got != tc.want || r.c.share.used.Load() != tc.want {
				t.Fatalf("%s (seed %d): budget holds %d, share %d, want %d", tc.name, seed, got, r.c.share.used.Load(), tc.want)
			}
			if r.c.cut.Load() {
				t.Fatalf("%s: cut", tc.name)
			}
			r.c.Close()
			if got := r.gl.o.Bytes.Used(); got != 0 || len(r.gl.shares) != 0 {
				t.Fatalf("%s: closed, the budget still holds %d, shares %v", tc.name, got, r.gl.shares)
			}
		}
	}
}

// rawFrame is an empty frame of typ on stream.
func rawFrame(typ, flags byte, stream uint32) []byte {
	f := make([]byte, frameHeader)
	f[3], f[4] = typ, flags
	binary.BigEndian.PutUint32(f[5:], stream)
	return f
}

// TestBodiesPastShare: an address whose unfinished messages pass a
// quarter of the budget, over any number of connections, is not refused
// for it while its messages are young and the budget has room (a client
// sending many large requests at once); once one is slowBody old, its
// stream is refused for abuse (its address cools down) at the sweeper's
// tick, and the connections stay. A message that would take its address
// past its share while the budget is over three quarters full is refused at once,
// and one that would pass the budget, full of other addresses' bytes, too,
// without its address cooling down. Every refusal gives its bytes back and
// queues its stream's resets.
func TestBodiesPastShare(t *testing.T) {
	msg := grpcMessage(10000)
	r := newBodyRig(40000) // a share of 10,000 bytes
	other := r.conn()
	r.gl.conns.Store(r.c, struct{}{})
	r.gl.conns.Store(other, struct{}{})
	feedChunks(r.c, dataFrame(1, 0, msg[:6000], -1), 1)
	feedChunks(other, dataFrame(1, 0, msg[:3000], -1), 1)
	feedChunks(other, dataFrame(3, 0, msg[:2000], -1), 1)
	if len(r.eventList()) != 0 {
		t.Fatalf("refused past the share with young messages: %v", r.eventList())
	}
	r.now = r.now.Add(slowBody - time.Second)
	r.gl.tick()
	if len(r.eventList()) != 0 {
		t.Fatalf("refused before slowBody: %v", r.eventList())
	}
	r.now = r.now.Add(time.Second)
	r.gl.tick()
	if got := r.eventList(); !slices.Equal(got, []Event{EventRequestBytes, EventRequestBytes, EventRequestBytes}) {
		t.Fatalf("past the share, slowBody later: events %v, want its three streams refused (%q)", got, EventRequestBytes)
	}
	if r.c.cut.Load() || other.cut.Load() {
		t.Error("a connection was cut: only its streams are refused")
	}
	if !r.gl.coolingHost("192.0.2.1") {
		t.Error("the address does not cool down")
	}
	if got := r.gl.o.Bytes.Used(); got != 0 {
		t.Errorf("the refused streams' bytes are still held: %d", got)
	}
	if !slices.Equal(r.c.toServer, []uint32{1}) || !slices.Equal(sorted(other.toServer), []uint32{1, 3}) {
		t.Errorf("resets for grpc-go: %v and %v, want [1] and [1 3]", r.c.toServer, other.toServer)
	}

	// Over three quarters of the budget taken (the codec's part and its
	// own): a message that would take its address past its share is
	// refused at once.
	r = newBodyRig(40000)
	r.gl.o.Bytes.Take(25000)
	feedChunks(r.c, dataFrame(1, 0, msg[:6000], -1), 1)
	feedChunks(r.c, dataFrame(3, 0, msg[:5000], -1), 1)
	if !slices.Equal(r.eventList(), []Event{EventRequestBytes}) || r.c.cut.Load() {
		t.Fatalf("past the share with the budget over three quarters full: events %v, cut %v; want stream 3 refused", r.eventList(), r.c.cut.Load())
	}
	if got := r.gl.o.Bytes.Used(); got != 25000+6000+messageCost {
		t.Errorf("budget holds %d, want the codec's and stream 1's", got)
	}

	// Whole requests being served hold some of the budget (the codec's
	// part) and three addresses most of the rest; the fourth's bytes, under
	// its share, find it full.
	r = newBodyRig(40000)
	r.gl.o.Bytes.Take(10000)
	for i := range 4 {
		c := r.conn()
		c.host = net.IPv4(192, 0, 2, byte(10+i)).String()
		c.share = r.gl.joinShare(c.host)
		feedChunks(c, dataFrame(1, 0, msg[:9000], -1), 1)
		if c.cut.Load() {
			t.Fatalf("address %d: cut", i)
		}
		if got := len(c.toServer); got != map[bool]int{true: 1}[i == 3] {
			t.Fatalf("address %d: %d streams refused", i, got)
		}
	}
	if !slices.Equal(r.eventList(), []Event{EventBudgetFull}) || r.gl.coolingHost("192.0.2.13") {
		t.Errorf("past the budget: events %v, cooling %v; want %q, not cooling", r.eventList(), r.gl.coolingHost("192.0.2.13"), EventBudgetFull)
	}
}

func sorted(s []uint32) []uint32 { return slices.Sorted(slices.Values(s)) }

// TestStalledBody: a message still unfinished stalledBody after its first
// byte has its stream refused at the sweeper's tick, for abuse.
func TestStalledBody(t *testing.T) {
	r := newBodyRig(1 << 20)
	r.gl.conns.Store(r.c, struct{}{})
	feedChunks(r.c, dataFrame(1, 0, grpcMessage(1000)[:10], -1), 1)
	r.now = r.now.Add(stalledBody - time.Second)
	r.gl.tick()
	if len(r.eventList()) != 0 {
		t.Fatalf("refused before stalledBody: %v", r.eventList())
	}
	r.now = r.now.Add(2 * time.Second)
	r.gl.tick()
	if !slices.Equal(r.eventList(), []Event{EventStalledBody}) || !r.gl.coolingHost("192.0.2.1") || r.c.cut.Load() {
		t.Errorf("stalled past stalledBody: events %v, cooling %v, cut %v", r.eventList(), r.gl.coolingHost("192.0.2.1"), r.c.cut.Load())
	}
	if !slices.Equal(r.c.toServer, []uint32{1}) {
		t.Errorf("resets for grpc-go: %v, want [1]", r.c.toServer)
	}
}

// FuzzFrameReader feeds the guard's inbound path (frames, resets, gRPC
// message prefixes, padding) hostile bytes, whole and in chunks cut where
// the input says: it never panics, never passes more than it was given,
// counts the same whatever the chunks (unless a guard cut the connection),
// and gives every byte back when the connection closes.
func FuzzFrameReader(f *testing.F) {
	msg := grpcMessage(300)
	f.Add(dataFrame(1, 0, msg[:100], -1), []byte{3, 50})
	f.Add(append(dataFrame(1, 0, msg[:3], 4), dataFrame(1, flagEndStream, msg[3:], -1)...), []byte{1, 1, 1})
	f.Add(append(dataFrame(3, 0, msg[:200], -1), rawFrame(frameRST, 0, 3)...), []byte{})
	f.Add(append(rawFrame(frameHeaders, 0, 5), dataFrame(5, 0, grpcMessage(0), 255)...), []byte{9})
	f.Fuzz(func(t *testing.T, wire, cuts []byte) {
		feed := func(chunked bool) (*bodyRig, int64, bool) {
			r := newBodyRig(1 << 30)
			rest := wire
			for i := 0; len(rest) > 0 && !r.c.cut.Load(); i++ {
				n := len(rest)
				if chunked && i < len(cuts) {
					n = min(n, 1+int(cuts[i]))
				}
				if got := r.c.in.feed(rest[:n], r.c.inbound, r.c.inboundData); got > n {
					t.Fatalf("feed passed %d of %d bytes", got, n)
				}
				rest = rest[n:]
			}
			return r, r.gl.o.Bytes.Used(), r.c.cut.Load()
		}
		whole, usedWhole, cutWhole := feed(false)
		parts, usedParts, cutParts := feed(true)
		if !cutWhole && !cutParts && usedWhole != usedParts {
			t.Fatalf("held %d fed whole, %d fed in chunks", usedWhole, usedParts)
		}
		for _, r := range []*bodyRig{whole, parts} {
			r.c.Close()
			if used := r.gl.o.Bytes.Used(); used != 0 || len(r.gl.shares) != 0 {
				t.Fatalf("closed: the budget holds %d, shares %v", used, r.gl.shares)
			}
		}
	})
}

// TestManyRecordsAreBounded: a byte of a message on each of many streams
// (grpc-go drops the data of streams it closed, but the guard keeps a
// record of each) counts its record's cost, so the records a connection
// can make before the budget cuts it are bounded by the budget, not by
// the bytes sent.
func TestManyRecordsAreBounded(t *testing.T) {
	r := newBodyRig(64 << 10)
	var wire []byte
	for i := range 10000 {
		wire = append(wire, dataFrame(uint32(2*i+1), 0, []byte{0}, -1)...)
	}
	feedChunks(r.c, wire, 1)
	if !r.c.cut.Load() {
		t.Fatalf("10,000 one-byte messages on a 64 KiB budget: not cut, %d held", r.gl.o.Bytes.Used())
	}
	if n := len(r.c.messages); n > (64<<10)/messageCost+1 {
		t.Errorf("%d records kept, past the budget's %d", n, (64<<10)/messageCost)
	}
}

// TestBodiesAfterTheServerEnds: once the server ends a client stream
// (trailers, or a reset), the rest of its body is bytes grpc-go discards,
// not a new message: nothing is counted for it, however much comes or
// however long it takes (a 3 MB request refused from its prefix used to
// be read as messages of whatever length its bytes spelled, held past
// slowBody on a slow machine and cut for abuse). The record of such
// streams is bounded.
func TestBodiesAfterTheServerEnds(t *testing.T) {
	msg := grpcMessage(100000)
	for i := prefixLen; i < len(msg); i++ {
		msg[i] = 0x7f // read as a prefix, a message of about 2 GB
	}
	for _, end := range []struct {
		name  string
		frame []byte
	}{
		{"trailers", rawFrame(frameHeaders, flagEndStream, 1)},
		{"a reset", append(rawFrame(frameRST, 0, 1)[:frameHeader:frameHeader], 0, 0, 0, 0)},
	} {
		r := newBodyRig(1 << 20)
		feedChunks(r.c, dataFrame(1, 0, msg[:20000], -1), 1)
		if r.gl.o.Bytes.Used() == 0 {
			t.Fatalf("%s: the unfinished message counts nothing", end.name)
		}
		if _, err := r.c.Write(end.frame); err != nil {
			t.Fatal(err)
		}
		if got := r.gl.o.Bytes.Used(); got != 0 {
			t.Fatalf("%s: the server ended the stream, the budget still holds %d", end.name, got)
		}
		feedChunks(r.c, dataFrame(1, 0, msg[20000:60000], -1), 2)
		if got := r.gl.o.Bytes.Used(); got != 0 {
			t.Fatalf("%s: the rest of the body holds %d, want nothing", end.name, got)
		}
		feedChunks(r.c, dataFrame(1, flagEndStream, msg[60000:], -1), 3)
		if got := r.gl.o.Bytes.Used(); got != 0 || r.c.cut.Load() {
			t.Fatalf("%s: the rest of the body holds %d (cut %v), want nothing", end.name, got, r.c.cut.Load())
		}
		if len(r.c.ended) != 0 {
			t.Fatalf("%s: the client ended the stream, %d ended streams still recorded", end.name, len(r.c.ended))
		}
	}
	r := newBodyRig(1 << 20)
	for s := uint32(1); s < 2*maxEnded+200; s += 2 {
		r.c.mu.Lock()
		r.c.endedByServer(s)
		r.c.mu.Unlock()
	}
	if len(r.c.ended) > maxEnded {
		t.Fatalf("%d ended streams recorded, want at most %d", len(r.c.ended), maxEnded)
	}
}

// TestFinishedRequestsLeaveNoRecord: the server's answer to a request the
// client already sent in full (every unary call) ends a stream the client
// has nothing more to send on, so it leaves no record of an ended stream.
// (Every answer was recorded until the record held maxEnded, and then each
// answer scanned it for the lowest stream under the connection's lock: a
// cost on every call of a long-lived connection, as Envoy's are.) A stream
// the server ends in the middle of a frame of its body is recorded, and
// the rest of that frame counts nothing.
func TestFinishedRequestsLeaveNoRecord(t *testing.T) {
	r := newBodyRig(1 << 20)
	for s := uint32(1); s < 4*maxEnded; s += 2 {
		feedChunks(r.c, rawFrame(frameHeaders, flagEndHeaders, s), uint64(s))
		feedChunks(r.c, dataFrame(s, flagEndStream, grpcMessage(100), -1), uint64(s))
		if _, err := r.c.Write(rawFrame(frameHeaders, flagEndStream, s)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(r.c.ended); n != 0 {
		t.Fatalf("%d ended streams recorded after requests sent in full, want none", n)
	}

	msg := grpcMessage(100000)
	frame := dataFrame(1<<20+1, 0, msg[:30000], -1)
	r.c.in.feed(frame[:frameHeader+10000], r.c.inbound, r.c.inboundData)
	if _, err := r.c.Write(rawFrame(frameRST, 0, 1<<20+1)); err != nil {
		t.Fatal(err)
	}
	r.c.in.feed(frame[frameHeader+10000:], r.c.inbound, r.c.inboundData)
	if got := r.gl.o.Bytes.Used(); got != 0 {
		t.Fatalf("the rest of a frame the server ended its stream in holds %d, want nothing", got)
	}
	if _, ok := r.c.ended[1<<20+1]; !ok {
		t.Fatal("a stream ended in the middle of its body's frame is not recorded")
	}
}

// BenchmarkUnaryCalls is the guard's work for one unary call on a
// long-lived connection: the request's headers and message in, the
// answer's headers, message and trailers out.
func BenchmarkUnaryCalls(b *testing.B) {
	r := newBodyRig(1 << 30)
	// The frames are built once and each call's stream id written into
	// them: the loop measures the guard, not the test's allocations.
	in := append(rawFrame(frameHeaders, flagEndHeaders, 1), dataFrame(1, flagEndStream, grpcMessage(100), -1)...)
	out := slices.Concat(rawFrame(frameHeaders, flagEndHeaders, 1), dataFrame(1, 0, grpcMessage(20), -1),
		rawFrame(frameHeaders, flagEndStream|flagEndHeaders, 1))
	inAt := []int{5, frameHeader + 5}
	outAt := []int{5, frameHeader + 5, 2*frameHeader + prefixLen + 20 + 5}
	b.ReportAllocs()
	for i := range b.N {
		s := uint32(2*i + 1)
		for _, at := range inAt {
			binary.BigEndian.PutUint32(in[at:], s)
		}
		for _, at := range outAt {
			binary.BigEndian.PutUint32(out[at:], s)
		}
		r.c.in.feed(in, r.c.inbound, r.c.inboundData)
		if _, err := r.c.Write(out); err != nil {
			b.Fatal(err)
		}
	}
}
