package h2guard

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"slices"
	"testing"
	"time"
)

// frameOf is a frame of typ on stream carrying payload.
func frameOf(typ, flags byte, stream uint32, payload []byte) []byte {
	f := make([]byte, frameHeader, frameHeader+len(payload))
	f[0], f[1], f[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	f[3], f[4] = typ, flags
	binary.BigEndian.PutUint32(f[5:], stream)
	return append(f, payload...)
}

// headers is a client HEADERS frame opening stream, its block whole.
func headers(stream uint32, flags byte) []byte {
	return frameOf(frameHeaders, flags|flagEndHeaders, stream, make([]byte, 20))
}

// TestPendingStreams: a stream counts from its HEADERS until its first
// request message is whole, its client ends it or resets it; an address
// past pendingPerAddress has its next stream refused for abuse, over any
// number of connections; with every address's streams at pendingInAll, an
// address holding pendingFloor or more has its next refused (not for
// abuse), one holding fewer never.
func TestPendingStreams(t *testing.T) {
	r := newBodyRig(1 << 30)
	other := r.conn()
	msg := grpcMessage(100)
	feedChunks(r.c, slices.Concat(headers(1, 0), dataFrame(1, 0, msg, -1), headers(3, flagEndStream), headers(5, 0),
		rawFrame(frameRST, 0, 5), headers(7, 0), dataFrame(7, flagEndStream, msg[:50], -1)), 1)
	if got := r.c.share.awaiting.Load(); got != 0 || r.gl.awaiting.Load() != 0 {
		t.Fatalf("streams whose request came, that ended or were reset: %d pending, want 0", got)
	}
	for i := range uint32(pendingPerAddress) {
		c := r.c
		if i%2 == 1 {
			c = other
		}
		feedChunks(c, headers(101+2*i, 0), 1)
	}
	if len(r.eventList()) != 0 || r.c.share.awaiting.Load() != pendingPerAddress {
		t.Fatalf("%d pending: events %v", r.c.share.awaiting.Load(), r.eventList())
	}
	feedChunks(other, headers(1<<20+1, 0), 1)
	if !slices.Equal(r.eventList(), []Event{EventPendingStreams}) || !r.gl.coolingHost("192.0.2.1") || other.cut.Load() {
		t.Fatalf("one past pendingPerAddress: events %v, cooling %v, cut %v", r.eventList(), r.gl.coolingHost("192.0.2.1"), other.cut.Load())
	}
	if !slices.Equal(other.toServer, []uint32{1<<20 + 1}) {
		t.Errorf("resets for grpc-go %v, want the refused stream's", other.toServer)
	}
	r.c.Close()
	other.Close()
	if r.gl.awaiting.Load() != 0 {
		t.Fatalf("closed: %d still pending", r.gl.awaiting.Load())
	}

	r = newBodyRig(1 << 30)
	r.gl.awaiting.Store(pendingInAll) // other addresses' (the count alone)
	for i := range uint32(pendingFloor) {
		feedChunks(r.c, headers(1+2*i, 0), 1)
	}
	if len(r.eventList()) != 0 {
		t.Fatalf("an address under pendingFloor refused: %v", r.eventList())
	}
	feedChunks(r.c, headers(1001, 0), 1)
	if !slices.Equal(r.eventList(), []Event{EventPendingFull}) || r.gl.coolingHost("192.0.2.1") {
		t.Errorf("at pendingInAll, past the floor: events %v, cooling %v; want %q, not cooling", r.eventList(),
			r.gl.coolingHost("192.0.2.1"), EventPendingFull)
	}
}

// TestStalledRequest: a stream whose request has not come pendingTimeout
// after its HEADERS is refused at the sweeper's tick, for abuse; its
// connection stays, and a stream whose request came is left alone.
func TestStalledRequest(t *testing.T) {
	r := newBodyRig(1 << 30)
	r.gl.conns.Store(r.c, struct{}{})
	feedChunks(r.c, slices.Concat(headers(1, 0), headers(3, 0), dataFrame(3, 0, grpcMessage(10), -1)), 1)
	r.now = r.now.Add(pendingTimeout)
	r.gl.tick()
	if len(r.eventList()) != 0 {
		t.Fatalf("refused at pendingTimeout: %v", r.eventList())
	}
	r.now = r.now.Add(time.Second)
	r.gl.tick()
	if !slices.Equal(r.eventList(), []Event{EventStalledRequest}) || !r.gl.coolingHost("192.0.2.1") || r.c.cut.Load() {
		t.Fatalf("past pendingTimeout: events %v, cooling %v, cut %v", r.eventList(), r.gl.coolingHost("192.0.2.1"), r.c.cut.Load())
	}
	if !slices.Equal(r.c.toServer, []uint32{1}) || r.gl.awaiting.Load() != 0 {
		t.Errorf("resets for grpc-go %v (want [1]), %d pending", r.c.toServer, r.gl.awaiting.Load())
	}
}

// TestHeaderBlocks: a header block past maxHeaderBlock cuts its
// connection for abuse as the frame that passes it arrives, and so does
// one still open headerBlockTimeout after it began; blocks that end are
// left alone, however many CONTINUATIONs they take.
func TestHeaderBlocks(t *testing.T) {
	chunk := make([]byte, 16<<10)
	r := newBodyRig(1 << 30)
	ok := frameOf(frameHeaders, 0, 1, chunk)
	for range 2 {
		ok = append(ok, frameOf(frameContinuation, 0, 1, chunk)...)
	}
	ok = append(ok, frameOf(frameContinuation, flagEndHeaders, 1, chunk)...)
	feedChunks(r.c, slices.Concat(ok, frameOf(frameHeaders, 0, 3, chunk), frameOf(frameContinuation, flagEndHeaders, 3, chunk)), 1)
	if r.c.cut.Load() || len(r.eventList()) != 0 {
		t.Fatalf("blocks of %d and %d bytes that ended: cut %v, events %v", 4*len(chunk), 2*len(chunk), r.c.cut.Load(), r.eventList())
	}
	big := frameOf(frameHeaders, 0, 5, chunk)
	for range maxHeaderBlock / len(chunk) {
		big = append(big, frameOf(frameContinuation, 0, 5, chunk)...)
	}
	feedChunks(r.c, big, 1)
	if !r.c.cut.Load() || !slices.Equal(r.eventList(), []Event{EventHeaderBlock}) || !r.gl.coolingHost("192.0.2.1") {
		t.Fatalf("a block past maxHeaderBlock: cut %v, events %v", r.c.cut.Load(), r.eventList())
	}

	r = newBodyRig(1 << 30)
	r.gl.conns.Store(r.c, struct{}{})
	feedChunks(r.c, slices.Concat(frameOf(frameHeaders, 0, 1, chunk[:100]), frameOf(frameContinuation, 0, 1, chunk[:100])), 1)
	r.now = r.now.Add(headerBlockTimeout)
	r.gl.tick()
	if len(r.eventList()) != 0 {
		t.Fatalf("cut at headerBlockTimeout: %v", r.eventList())
	}
	r.now = r.now.Add(time.Second)
	r.gl.tick()
	if !slices.Equal(r.eventList(), []Event{EventHeaderBlock}) {
		t.Errorf("a block open past headerBlockTimeout: events %v", r.eventList())
	}
}

// frameList splits wire into its frames (after the client preface, if
// it starts with one).
func frameList(t *testing.T, wire []byte) [][]byte {
	t.Helper()
	wire = bytes.TrimPrefix(wire, []byte(clientPreface))
	var out [][]byte
	for len(wire) > 0 {
		if len(wire) < frameHeader {
			t.Fatalf("%d bytes left, not a frame", len(wire))
		}
		n := frameHeader + (int(wire[0])<<16 | int(wire[1])<<8 | int(wire[2]))
		if n > len(wire) {
			t.Fatalf("a frame of %d bytes, %d left", n, len(wire))
		}
		out = append(out, wire[:n])
		wire = wire[n:]
	}
	return out
}

// rst is the RST_STREAM frame of stream with code.
func rst(stream, code uint32) []byte {
	b := make([]byte, rstLen)
	putRST(b, stream, code)
	return b
}

// TestRefusedStreamsReachBothSides, over a real socket: a stream refused
// from the read path reaches grpc-go as the client's RST_STREAM(CANCEL)
// right after a boundary between frames, in order with the client's
// other frames, whatever the reads; one refused by the sweeper while the
// reader is blocked on a silent client wakes it; and the client reads
// RST_STREAM(ENHANCE_YOUR_CALM) for each. The connection stays open.
func TestRefusedStreamsReachBothSides(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	r := newBodyRig(1 << 30)
	c := &guardedConn{Conn: server, gl: r.gl, host: "127.0.0.1"}
	r.gl.startWatching(c)
	defer c.Close()
	c.share.awaiting.Store(pendingPerAddress - 2) // two more streams, and the third is refused
	sent := slices.Concat([]byte(clientPreface), headers(1, 0), headers(3, 0), headers(5, 0), dataFrame(1, flagEndStream, grpcMessage(30), -1))
	if _, err := client.Write(sent); err != nil {
		t.Fatal(err)
	}
	var got []byte
	buf := make([]byte, 7) // reads smaller than a frame: boundaries fall inside them
	want := slices.Concat(sent, rst(5, errCancel))
	for len(got) < len(want) {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		got = append(got, buf[:n]...)
	}
	fs := frameList(t, got)
	at := slices.IndexFunc(fs, func(f []byte) bool { return bytes.Equal(f, rst(5, errCancel)) })
	if at < 0 || !slices.EqualFunc(slices.Delete(slices.Clone(fs), at, at+1), frameList(t, sent), bytes.Equal) {
		t.Fatalf("grpc-go read %x\nwant the client's frames with RST_STREAM(5, CANCEL) after HEADERS(5)", got)
	}
	if at < 3 {
		t.Errorf("RST_STREAM(5) at frame %d, before HEADERS(5) reached grpc-go", at)
	}
	readRST := func(stream uint32) {
		t.Helper()
		b := make([]byte, rstLen)
		_ = client.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.ReadFull(client, b); err != nil || !bytes.Equal(b, rst(stream, errCalm)) {
			t.Fatalf("the client read %x (%v), want RST_STREAM(%d, ENHANCE_YOUR_CALM)", b, err, stream)
		}
	}
	readRST(5)

	// Streams 1 and 3 are still open; 3 has sent nothing since its HEADERS.
	// A reader blocked on the silent client is woken for the sweeper's
	// refusal.
	read := make(chan []byte)
	go func() {
		b := make([]byte, 64)
		n, _ := c.Read(b)
		read <- b[:n]
	}()
	r.gl.conns.Store(c, struct{}{})
	r.now = r.now.Add(pendingTimeout + time.Second)
	r.gl.tick()
	select {
	case b := <-read:
		if !bytes.Equal(b, rst(3, errCancel)) {
			t.Fatalf("the woken reader got %x, want RST_STREAM(3, CANCEL)", b)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the reader blocked on a silent client was not woken")
	}
	readRST(3)
	if c.closed.Load() || c.cut.Load() {
		t.Error("the connection was closed: only its streams are refused")
	}
	// Still readable after the wake-up: the deadline is gone.
	go func() { _, _ = client.Write(headers(7, flagEndStream)) }()
	b := make([]byte, 64)
	_ = c.Conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if n, err := c.Read(b); err != nil || !bytes.Equal(b[:n], headers(7, flagEndStream)) {
		t.Errorf("after the wake-up, read %x (%v)", b[:n], err)
	}
}
