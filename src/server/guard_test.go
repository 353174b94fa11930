package server

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestInFlightLimit(t *testing.T) {
	var events []GuardEvent
	limit := inFlightLimit(1, func(e GuardEvent) { events = append(events, e) })
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
	if !slices.Equal(events, []GuardEvent{EventCallRefused}) {
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
