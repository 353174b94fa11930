package redis

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"
)

// Design of the batcher (REDIS_PIPELINE_WINDOW, _LIMIT, _MAX_IN_FLIGHT)
//
// Group commit with a leader: at most maxLeaders batches are in flight. A
// decision that arrives while fewer are in flight sends its own script call
// at once, from its own goroutine: a lone request pays nothing, not even a
// goroutine hand-off. A decision that arrives while all are in flight queues.
// When a batch's reply is in, its leader hands the replies out and promotes
// the first queued decision, with everything queued behind it (up to the
// limit), to lead the next batch. So batches grow only as load does, and a
// decision crosses goroutines at most once (a follower's wake-up), where a
// pool of flusher goroutines would cost two hand-offs per decision.
//
// A promoted leader takes its batch from the queue when it runs, not when
// it is promoted: what queued while its goroutine waited to be scheduled
// (on a busy service, most of a round trip) goes with it, rather than
// waiting a whole round trip more for the next batch. Before taking it, it
// yields once (runtime.Gosched): the goroutines that are runnable then
// (requests on their way to the store) run first and join the queue. On an
// idle service nothing is runnable and the yield returns at once; on a
// busy one those goroutines would have taken the CPU before the reply came
// back anyway. So batches grow with load, not with a timer, and Redis,
// whose cost is mostly per call, pays less per decision
// (docs/performance.md).
//
// On a single node or Sentinel a batch is one script call: batch.lua takes
// the decisions one after the other, each atomic, so Redis and the client pay
// their per-command cost once per batch. In Cluster mode the decisions'
// keys live in different slots, so a batch is a pipeline of one call per
// decision (go-redis sends one pipeline per node).

// defaultInFlight is how many batches may be in flight at once unless
// REDIS_PIPELINE_MAX_IN_FLIGHT says otherwise. More in flight means
// smaller batches: more script calls, each with a fixed cost in Redis and,
// above all, a write and a read that each wake the other process (the
// largest cost of a round trip: docs/performance.md). Fewer means requests wait
// for the batch ahead of theirs, up to a round trip more with a distant
// Redis. Redis's CPU per decision is mostly per call at the sizes batches
// reach, so one in flight (batches twice as large as with two) is the
// default: on the benchmark's machine it answered as many requests as 2,
// within the noise, for less of Redis's CPU. With Redis across a network,
// 2 or more overlap round trips. See docs/performance.md.
const defaultInFlight = 1

type batcher struct {
	runner     *runner
	merge      bool // one script call per batch (not in Cluster mode)
	limit      int
	maxLeaders int
	// yield is what a promoted leader does before taking its batch:
	// runtime.Gosched (see the design note); tests replace it.
	yield func()

	mu      sync.Mutex
	queue   []*call
	leaders int // batches in flight; the queue only fills while this is maxLeaders
	// pending counts promoted leaders that have not taken their batch yet
	// (counted in leaders too): a leader that finishes promotes another
	// only if the queue holds more than they will take, so with several in
	// flight the queue still goes out as one batch, not one per leader.
	pending int
}

// newBatcher takes BatchLimit and BatchInFlight from opts.
func newBatcher(r *runner, merge bool, opts Options) *batcher {
	b := &batcher{runner: r, merge: merge, limit: opts.BatchLimit, maxLeaders: opts.BatchInFlight, yield: runtime.Gosched}
	if b.limit <= 0 {
		b.limit = 128
	}
	if b.maxLeaders <= 0 {
		b.maxLeaders = defaultInFlight
	}
	return b
}

// heavyKeys is the most keys a decision may hold and still join a batch.
// A heavier one (REQUEST_MAX_KEYS allows 256) is sent alone, beside the
// batches: merged, its work would hold every light decision batched with
// it, and its failure past the timeout would fail them all.
const heavyKeys = 32

// errQueueTimeout answers a call that spent its timeout waiting in the queue.
var errQueueTimeout = fmt.Errorf("timed out waiting for a batch: %w", context.DeadlineExceeded)

// send sends one call, alone or in a batch, and sets its answer. If
// ctx ends while the call still waits in the queue, it leaves the queue and
// is never sent. deadline (zero: none) bounds the call too: a batch is sent
// with its leader's deadline, and a queued call found past its deadline
// when the queue is promoted is answered errQueueTimeout, unsent. (So a
// queued call can learn of its timeout up to one batch late; ctx, which
// carries Envoy's deadline, still ends the wait at once.)
func (b *batcher) send(ctx context.Context, deadline time.Time, c *call) {
	c.deadline, c.done = deadline, make(chan struct{}, 1)
	if len(c.keys) > heavyKeys {
		b.sendBatch(ctx, []*call{c})
		return
	}
	b.mu.Lock()
	if b.leaders < b.maxLeaders {
		b.leaders++
		b.mu.Unlock()
		b.lead(ctx, []*call{c})
		return
	}
	c.queued = true
	b.queue = append(b.queue, c)
	b.mu.Unlock()

	select {
	case <-c.done:
	case <-ctx.Done():
		b.mu.Lock()
		if c.queued {
			b.queue = slices.DeleteFunc(b.queue, func(q *call) bool { return q == c })
			b.mu.Unlock()
			c.err = ctx.Err()
			return
		}
		b.mu.Unlock()
		// Already taken into a batch: its reply, or the duty to lead it, is
		// on the way (within the batch's timeout). The queue depends on a
		// promoted call leading, so wait for it.
		<-c.done
		if c.lead {
			b.lead(context.Background(), b.take(c))
		}
		c.err = ctx.Err()
		return
	}
	if c.lead {
		b.lead(ctx, b.take(c))
	}
}

// take is the batch a promoted leader sends: itself and what is queued
// behind it now, up to the limit, less the calls already past their
// deadline (they are answered, never sent). See the design note above for
// the yield.
func (b *batcher) take(leader *call) []*call {
	b.yield()
	batch := []*call{leader}
	var expired []*call
	now := time.Now()
	b.mu.Lock()
	b.pending--
	n := 0
	for _, c := range b.queue {
		if len(batch) == b.limit {
			break
		}
		n++
		c.queued = false
		if !c.deadline.IsZero() && !now.Before(c.deadline) {
			expired = append(expired, c)
		} else {
			batch = append(batch, c)
		}
	}
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:]) // drop the moved-out calls' pointers, replies included
	b.queue = b.queue[:rest]
	b.mu.Unlock()
	for _, c := range expired {
		c.err = errQueueTimeout
		c.done <- struct{}{}
	}
	return batch
}

// lead sends batch (batch[0] is the caller's own call), wakes the other
// callers, and passes the lead on to the first call that queued meanwhile
// (one found past its deadline is answered, never sent). The batch is
// bounded by the leader's deadlines (ctx's and the timeout's): callers share
// a deadline budget (Envoy's), so the first to arrive has the earliest
// deadline, and a Redis too slow for it is too slow for the rest. The
// leader's cancellation does not end the batch: Envoy cancels a call when
// its client goes away, which says nothing about the other callers'
// decisions (and cutting a command short costs go-redis its connection).
func (b *batcher) lead(ctx context.Context, batch []*call) {
	b.sendBatch(ctx, batch)
	for _, c := range batch[1:] {
		c.done <- struct{}{}
	}
	var next *call
	var expired []*call
	now := time.Now()
	b.mu.Lock()
	for len(b.queue) > b.pending*(b.limit-1) && next == nil {
		c := b.queue[0]
		b.queue[0] = nil
		b.queue = b.queue[1:]
		c.queued = false
		if !c.deadline.IsZero() && !now.Before(c.deadline) {
			expired = append(expired, c)
		} else {
			next = c
		}
	}
	if next == nil {
		b.leaders--
	} else {
		b.pending++
	}
	b.mu.Unlock()
	for _, c := range expired {
		c.err = errQueueTimeout
		c.done <- struct{}{}
	}
	if next != nil {
		next.lead = true
		next.done <- struct{}{}
	}
}

// sendBatch sends the batch's calls in one round trip and sets every
// call's reply and err.
func (b *batcher) sendBatch(ctx context.Context, batch []*call) {
	deadline, bounded := ctx.Deadline()
	if d := batch[0].deadline; !d.IsZero() && (!bounded || d.Before(deadline)) {
		deadline, bounded = d, true
	}
	ctx = context.WithoutCancel(ctx) // keeps ctx's values (tracing), not its end
	if bounded {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	b.runner.send(ctx, b.merge, batch)
}
