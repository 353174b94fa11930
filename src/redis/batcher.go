package redis

import (
	"context"
	"fmt"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Design of the batcher (REDIS_PIPELINE_WINDOW, REDIS_PIPELINE_LIMIT)
//
// Concurrent decisions hand their script calls to a queue; a few flusher
// goroutines each take the first waiting call, add whatever else is already
// queued (up to the limit, and for at most the window), and send them all in
// one pipeline: one write and one read for many decisions, on our side and on
// Redis's. A flusher never waits for more work: when the queue is empty it
// sends what it has at once, so a lone request pays no delay and batching
// grows only as load does (group commit). While one flusher waits for Redis,
// the others collect the next batch.
//
// On a single node or Sentinel a batch is one script call: batch.lua takes
// the decisions one after the other, each atomic, so Redis and the client pay
// their per-command cost once per batch. In Cluster mode the decisions'
// keys live in different slots, so a batch is a pipeline of one call per
// decision (go-redis sends one pipeline per node).

// call is one script invocation waiting for a pipeline.
type call struct {
	keys []string
	args []any
	done chan callResult // buffered: a flusher never blocks on a caller that gave up
}

type callResult struct {
	reply any
	err   error
}

type batcher struct {
	client  goredis.UniversalClient
	merge   bool // one script call per batch (not in Cluster mode)
	queue   chan *call
	window  time.Duration
	limit   int
	timeout time.Duration
	stop    chan struct{}
	wg      sync.WaitGroup
}

// flushers is how many pipelines may be in flight at once.
const flushers = 4

func newBatcher(client goredis.UniversalClient, merge bool, window time.Duration, limit int, timeout time.Duration) *batcher {
	if limit <= 0 {
		limit = 128
	}
	b := &batcher{client: client, merge: merge, queue: make(chan *call, 4096), window: window, limit: limit, timeout: timeout, stop: make(chan struct{})}
	for range flushers {
		b.wg.Add(1)
		go b.flushLoop()
	}
	return b
}

// do queues one script call and waits for its reply or ctx.
func (b *batcher) do(ctx context.Context, keys []string, args []any) (any, error) {
	c := &call{keys: keys, args: args, done: make(chan callResult, 1)}
	select {
	case b.queue <- c:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case r := <-c.done:
		return r.reply, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (b *batcher) flushLoop() {
	defer b.wg.Done()
	batch := make([]*call, 0, b.limit)
	for {
		select {
		case <-b.stop:
			return
		case c := <-b.queue:
			batch = append(batch[:0], c)
		}
		deadline := time.Now().Add(b.window)
	collect:
		for len(batch) < b.limit && time.Now().Before(deadline) {
			select {
			case c := <-b.queue:
				batch = append(batch, c)
			default:
				break collect // nothing else waiting: send now
			}
		}
		b.flush(batch)
	}
}

func (b *batcher) flush(batch []*call) {
	ctx := context.Background()
	if b.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.timeout)
		defer cancel()
	}
	if b.merge && len(batch) > 1 {
		b.flushMerged(ctx, batch)
		return
	}
	cmds := make([]*goredis.Cmd, len(batch))
	_, _ = b.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for i, c := range batch {
			cmds[i] = batchScript.EvalSha(ctx, p, c.keys, c.args...)
		}
		return nil
	})
	for i, c := range batch {
		reply, err := cmds[i].Result()
		if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
			// Not run: running it again counts it once.
			reply, err = batchScript.Run(ctx, b.client, c.keys, c.args...).Result()
		}
		c.done <- callResult{reply, err}
	}
}

// flushMerged sends the whole batch as one script call and splits the
// reply: 32 bytes per hit, decision after decision.
func (b *batcher) flushMerged(ctx context.Context, batch []*call) {
	var keys []string
	var args []any
	for _, c := range batch {
		keys = append(keys, c.keys...)
		args = append(args, c.args...)
	}
	reply, err := batchScript.Run(ctx, b.client, keys, args...).Result()
	packed, ok := reply.(string)
	if err == nil && (!ok || len(packed) != 32*len(keys)) {
		err = fmt.Errorf("redis: unexpected script reply %T (%d bytes) for %d hits", reply, len(packed), len(keys))
	}
	off := 0
	for _, c := range batch {
		if err != nil {
			c.done <- callResult{nil, err}
			continue
		}
		n := 32 * len(c.keys)
		c.done <- callResult{packed[off : off+n], nil}
		off += n
	}
}

func (b *batcher) close() {
	close(b.stop)
	b.wg.Wait()
}
