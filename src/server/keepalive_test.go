package server

import (
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
)

// pingIdle opens a raw HTTP/2 connection to addr, sends n PINGs every
// interval with no call in flight (as Envoy's connection keepalive does),
// and reports how many were acknowledged and whether the server sent GOAWAY.
func pingIdle(t *testing.T, addr string, n int, interval time.Duration) (acks int, goAway bool) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	var wmu sync.Mutex // the reader acknowledges settings while the test pings
	write := func(f func() error) error {
		wmu.Lock()
		defer wmu.Unlock()
		return f()
	}
	if err := write(func() error { return fr.WriteSettings() }); err != nil {
		t.Fatal(err)
	}
	type event struct{ ack, goAway bool }
	events := make(chan event, 64)
	go func() {
		defer close(events)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					_ = write(fr.WriteSettingsAck)
				}
			case *http2.PingFrame:
				if f.IsAck() {
					events <- event{ack: true}
				}
			case *http2.GoAwayFrame:
				events <- event{goAway: true}
			}
		}
	}()
	for i := range n {
		if i > 0 {
			time.Sleep(interval) // the pacing under test, not a wait for a result
		}
		if err := write(func() error { return fr.WritePing(false, [8]byte{byte(i)}) }); err != nil {
			return acks, goAway // the server hung up
		}
		select {
		case ev, ok := <-events:
			if !ok {
				return acks, goAway
			}
			acks += boolInt(ev.ack)
			goAway = goAway || ev.goAway
			if ev.goAway {
				return acks, true
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no answer to PING %d within 5s", i+1)
		}
	}
	return acks, goAway
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestKeepaliveEnforcementAllowsIdlePings(t *testing.T) {
	tests := []struct {
		name       string
		opts       []grpc.ServerOption
		wantGoAway bool
	}{
		// The control: grpc-go's default policy turns idle pings away, which
		// shows the test can see a GOAWAY.
		{"grpc-go default", nil, true},
		{"ours", []grpc.ServerOption{keepaliveEnforcement(50 * time.Millisecond)}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const n = 5
			acks, goAway := pingIdle(t, serveHealth(t, tc.opts...), n, 200*time.Millisecond)
			if goAway != tc.wantGoAway {
				t.Errorf("GOAWAY = %v after %d idle pings 200ms apart, want %v", goAway, acks, tc.wantGoAway)
			}
			if !tc.wantGoAway && acks != n {
				t.Errorf("%d of %d pings acknowledged", acks, n)
			}
		})
	}
}
