package limiter

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// ErrBreakerOpen is returned while a Breaker short-circuits its store.
var ErrBreakerOpen = errors.New("store circuit breaker open: the backend failed repeatedly")

// BreakerOptions configures a Breaker. Probe is required.
type BreakerOptions struct {
	// Failures in a row that open the breaker; 0 means 5.
	Failures int
	// ProbeInterval is how often Probe runs while open; 0 means 500ms.
	ProbeInterval time.Duration
	// Probe checks the backend (for Redis, a PING); nil error closes the
	// breaker.
	Probe func(ctx context.Context) error
	// OnChange, if not nil, is told every opening (true) and closing (false).
	OnChange func(open bool)
}

// Breaker wraps a Store: after Failures failed calls in a row it answers
// ErrBreakerOpen at once instead of letting every request wait for the
// backend's timeout, and probes the backend in the background (one goroutine,
// one probe at a time) until it answers, then closes. While open, the cost of
// a request is a load of an atomic: no goroutine, connection or buffer piles
// up behind a stalled backend. It is safe for concurrent use.
type Breaker struct {
	store  Store
	o      BreakerOptions
	open   atomic.Bool
	fails  atomic.Int64
	mu     sync.Mutex
	stop   chan struct{}
	probes sync.WaitGroup
}

// NewBreaker wraps s. Call Close to stop a running probe.
func NewBreaker(s Store, o BreakerOptions) *Breaker {
	if o.Failures <= 0 {
		o.Failures = 5
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = 500 * time.Millisecond
	}
	return &Breaker{store: s, o: o, stop: make(chan struct{})}
}

// Apply implements Store.
func (b *Breaker) Apply(ctx context.Context, batch Batch) ([]Outcome, error) {
	if b.open.Load() {
		return nil, ErrBreakerOpen
	}
	outs, err := b.store.Apply(ctx, batch)
	switch {
	case err == nil:
		if b.fails.Load() != 0 { // a store on every call would bounce the line between cores
			b.fails.Store(0)
		}
	case ctx.Err() != nil:
		// The caller gave up; that says nothing about the backend.
	case b.fails.Add(1) >= int64(b.o.Failures):
		b.trip()
	}
	return outs, err
}

func (b *Breaker) trip() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open.Load() {
		return
	}
	select {
	case <-b.stop:
		return
	default:
	}
	b.open.Store(true)
	if b.o.OnChange != nil {
		b.o.OnChange(true)
	}
	b.probes.Add(1)
	go b.probe()
}

func (b *Breaker) probe() {
	defer b.probes.Done()
	t := time.NewTicker(b.o.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), b.o.ProbeInterval)
		err := b.o.Probe(ctx)
		cancel()
		if err == nil {
			b.fails.Store(0)
			b.open.Store(false)
			if b.o.OnChange != nil {
				b.o.OnChange(false)
			}
			return
		}
	}
}

// Close stops the probe, if one runs. The breaker stays usable.
func (b *Breaker) Close() {
	b.mu.Lock()
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
	b.mu.Unlock()
	b.probes.Wait()
}
