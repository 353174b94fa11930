package server

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
)

// Health is the service's health as /healthcheck and the gRPC health service
// report it: healthy until shutdown starts, and while every registered check
// passes. It is safe for concurrent use; the zero value is healthy.
type Health struct {
	stopping atomic.Bool
	mu       sync.Mutex
	checks   []namedCheck
}

type namedCheck struct {
	name string
	fn   func() error
}

// AddCheck registers a component check (for example the Redis connection).
func (h *Health) AddCheck(name string, fn func() error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checks = append(h.checks, namedCheck{name, fn})
}

// Stopping marks the service as shutting down: from now on it is unhealthy,
// so load balancers drain it before the listeners close.
func (h *Health) Stopping() { h.stopping.Store(true) }

// Check returns nil when healthy, else why not.
func (h *Health) Check() error {
	if h.stopping.Load() {
		return fmt.Errorf("shutting down")
	}
	h.mu.Lock()
	checks := h.checks
	h.mu.Unlock()
	for _, c := range checks {
		if err := c.fn(); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	return nil
}

// ServeHTTP answers 200 "OK" when healthy, else 500 with the reason.
func (h *Health) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if err := h.Check(); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	_, _ = w.Write([]byte("OK"))
}
