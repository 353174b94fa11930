package server

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
)

type noService struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestSlowClientsAreBounded runs the listeners with short timeouts: an HTTP
// client that stops mid-headers is disconnected, and shutdown with a client
// stuck mid-body closes it after the grace and returns no error.
func TestSlowClientsAreBounded(t *testing.T) {
	httpAddr := freeAddr(t)
	log, hook := test.NewNullLogger()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{GRPCAddr: freeAddr(t), HTTPAddr: httpAddr, DebugAddr: freeAddr(t),
			Service: noService{}, Health: &Health{}, Logger: log, ShutdownTimeout: 300 * time.Millisecond,
			JSON:     http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.ReadAll(r.Body) }),
			Timeouts: Timeouts{ReadHeader: 200 * time.Millisecond, Read: 30 * time.Second}})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for { // readiness polling
		if c, err := net.Dial("tcp", httpAddr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("HTTP listener not up within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}

	slow, err := net.Dial("tcp", httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	_, _ = io.WriteString(slow, "GET /healthcheck HTTP/1.1\r\nHost: x\r\n") // never ends its headers
	_ = slow.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, slow); err != nil {
		t.Errorf("a client stuck in its headers was not disconnected: %v", err)
	}

	stuck, err := net.Dial("tcp", httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Close()
	_, _ = io.WriteString(stuck, "POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
	time.Sleep(50 * time.Millisecond) // let the server start reading the body (its state, not correctness)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run with a stuck client at shutdown = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its context ending")
	}
	forced := false
	for _, e := range hook.AllEntries() {
		forced = forced || e.Level == logrus.WarnLevel && e.Message != "shutting down"
	}
	if !forced {
		t.Errorf("no warning that connections were closed after the grace")
	}
}
