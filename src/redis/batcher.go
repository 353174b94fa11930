package redis

import (
	"context"
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
	queue   chan *call
	window  time.Duration
	limit   int
	timeout time.Duration
	stop    chan struct{}
	wg      sync.WaitGroup
}

// flushers is how many pipelines may be in flight at once.
const flushers = 4

func newBatcher(client goredis.UniversalClient, window time.Duration, limit int, timeout time.Duration) *batcher {
	if limit <= 0 {
		limit = 128
	}
	b := &batcher{client: client, queue: make(chan *call, 4096), window: window, limit: limit, timeout: timeout, stop: make(chan struct{})}
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

func (b *batcher) close() {
	close(b.stop)
	b.wg.Wait()
}
