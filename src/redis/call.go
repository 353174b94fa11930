package redis

import (
	"context"
	"fmt"
	"time"
)

// A decision's call to Redis and its route.

// call is one decision on its way to Redis, by one of two routes, which
// newCall chooses: batch.lua's (arg set, plain nil), or the plain
// fixed-window commands (plain set; plain.go). Everything that sends
// calls (runner.go) or reads their replies (Store.applyGroups) tells the
// routes apart by plain alone.
type call struct {
	keys  []string
	arg   []byte     // the decision's argument to batch.lua (scriptArg)
	plain *plainCall // the plain route's commands, or nil
	// deadline is when the call gives up: REDIS_TIMEOUT after its Apply
	// began (zero: never). A value, not a context with a timer: followers
	// are woken by their leader anyway, and a timer per decision showed in
	// the profile (docs/performance.md).
	deadline time.Time
	reply    any
	err      error
	// lead, when set, makes this call's goroutine the next batch's leader:
	// it takes the batch from the queue and sends it (see take).
	lead   bool
	queued bool          // waiting in batcher.queue; guarded by batcher.mu
	done   chan struct{} // buffered: a leader never blocks on a caller that gave up
}

// plainCall is a decision's hits as plain commands: INCRBY wkeys[i] by
// costs[i], each key expiring at expireAt[i] (PEXPIREAT ... NX).
type plainCall struct {
	wkeys    []string
	costs    []int64
	windows  []int64 // each hit's window number, by the estimate of Redis's clock
	expireAt []int64 // ms since the Unix epoch: when each hit's window ends
}

// newCall is g's call: plain commands when the plain path serves (see
// above) and g is eligible, else the function's.
func (s *Store) newCall(ctx context.Context, now int64, mode scriptMode, g *group) *call {
	if now == redisTime && !s.cluster && !s.plainOff.Load() && plainEligible(mode, g) && s.runner.ready.Load() && s.plainAllowed() {
		if est, ok := s.rclock.now(ctx); ok {
			n, jitter := len(g.hits), s.jitter()
			p := &plainCall{wkeys: make([]string, n), costs: make([]int64, n), windows: make([]int64, n), expireAt: make([]int64, n)}
			for i, h := range g.hits {
				period := int64(h.Rule.Period / time.Microsecond)
				w := est / period
				p.wkeys[i] = windowKey(g.keys[i], w)
				p.costs[i] = int64(h.Cost)
				p.windows[i] = w
				p.expireAt[i] = ((w+1)*period+999)/1000 + jitter // as batch.lua's ttl_ms, rounded up
			}
			return &call{keys: g.keys, plain: p}
		}
	}
	return &call{keys: g.keys, arg: scriptArg(now, mode, g.hits, g.wants, s.jitter())}
}

// merged is the keys and argument of one call holding every call of
// batch, decision after decision.
func merged(batch []*call) (keys []string, arg []byte) {
	for _, c := range batch {
		keys = append(keys, c.keys...)
		arg = append(arg, c.arg...)
	}
	return keys, arg
}

// splitMerged splits the reply (or err) of a merged call among its calls,
// decision after decision (see answerBytes).
func splitMerged(reply any, err error, batch []*call) {
	packed, ok := reply.(string)
	if err == nil && !ok {
		err = fmt.Errorf("redis: unexpected script reply %T for %d decisions", reply, len(batch))
	}
	off := 0
	for _, c := range batch {
		if err == nil {
			n, whole := answerBytes(packed[off:], len(c.keys))
			if !whole {
				err = fmt.Errorf("redis: unexpected script reply (%d bytes) for %d decisions", len(packed), len(batch))
			} else {
				// A call run again (as the script, after the function was
				// found missing) drops the error of its first run.
				c.reply, c.err = packed[off:off+n], nil
				off += n
				continue
			}
		}
		c.err = err
	}
	if err == nil && off != len(packed) {
		err = fmt.Errorf("redis: unexpected script reply (%d bytes) for %d decisions", len(packed), len(batch))
		for _, c := range batch {
			c.reply, c.err = nil, err
		}
	}
}
