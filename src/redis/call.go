package redis

import (
	"context"
	"time"
)

// A decision's call to Redis.

// call is one decision on its way to Redis: its keys and the route it
// goes by (route.go), which Store.route chose, and its place among the
// batcher's callers.
type call struct {
	keys  []string
	route route
	// deadline is when the call gives up: REDIS_TIMEOUT after its Apply
	// began (zero: never). A value, not a context with a timer: followers
	// are woken by their leader anyway, and a timer per decision showed in
	// the profile (docs/performance.md).
	deadline time.Time
	// err is why the call was never sent (it waited in the queue past its
	// deadline); what Redis answered is its route's.
	err error
	// lead, when set, makes this call's goroutine the next batch's leader:
	// it takes the batch from the queue and sends it (see take).
	lead   bool
	queued bool          // waiting in batcher.queue; guarded by batcher.mu
	done   chan struct{} // buffered: a leader never blocks on a caller that gave up
}

// failure is why the call has no answer, or nil.
func (c *call) failure() error {
	if c.err != nil {
		return c.err
	}
	return c.route.failure()
}

// route is g's call's route, the only place one is chosen: the plain
// fixed-window commands (plain.go) when the plain path serves, plainOK
// (false for a decision decided again, whose estimate of Redis's clock was
// off) and g is eligible, else batch.lua's.
func (s *Store) route(ctx context.Context, now int64, mode scriptMode, g *group, plainOK bool) *call {
	if plainOK && now == redisTime && !s.cluster && !s.plainOff.Load() && plainEligible(mode, g) && s.runner.ready.Load() && s.plainAllowed() {
		if est, ok := s.rclock.now(ctx); ok {
			both := &struct {
				call
				plainRoute
			}{call: call{keys: g.keys}}
			both.plainRoute.init(g, est, s.jitter())
			both.route = &both.plainRoute
			return &both.call
		}
	}
	at := time.UnixMicro(now)
	if now == redisTime {
		at = s.clock()
	}
	return scriptCall(g.keys, scriptArg(now, at, mode, g.hits, g.wants, s.jitter()))
}
