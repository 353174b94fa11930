package redis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// pauseScripts holds every script call in Redis (CLIENT PAUSE ... WRITE
// blocks EVALSHA) until resume is called, so a test can fill the batcher's
// leaders and queue deterministically.
func pauseScripts(t *testing.T, srv *redistest.Server) (resume func()) {
	t.Helper()
	if _, err := srv.Do("CLIENT", "PAUSE", "60000", "WRITE"); err != nil {
		t.Fatal(err)
	}
	resume = func() {
		if _, err := srv.Do("CLIENT", "UNPAUSE"); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(resume)
	return resume
}

// waitFor polls cond (the batcher's state, under its lock) until it holds.
func waitFor(t *testing.T, b *batcher, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		b.mu.Lock()
		ok := cond()
		b.mu.Unlock()
		if ok {
			return
		}
	}
	t.Fatalf("batcher never reached: %s", what)
}

type batchResult struct {
	out limiter.Outcome
	err error
}

// decide sends one hit on key through b and reports its outcome on res.
func decide(ctx context.Context, b *batcher, key string, r limiter.Rule, res chan<- batchResult) {
	h := &limiter.Hit{Key: key, Rule: r, Cost: 1}
	c := scriptCall([]string{keyVersion + key}, scriptArg(redisTime, time.Now(), modeEach, []*limiter.Hit{h}, nil, 0))
	b.send(ctx, time.Time{}, c)
	if err := c.failure(); err != nil {
		res <- batchResult{err: err}
		return
	}
	outs, err := parseOutcomes(c.route.(*scriptRoute).reply, 1, nil)
	if err != nil {
		res <- batchResult{err: err}
		return
	}
	res <- batchResult{out: outs[0]}
}

func newTestBatcher(t *testing.T, inFlight int) (*batcher, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	c := single(t, srv)
	r := newRunner(c)
	if err := r.load(context.Background()); err != nil {
		t.Fatal(err)
	}
	return newBatcher(r, true, Options{BatchInFlight: inFlight}), srv
}

// fillLeaders starts b.maxLeaders decisions on key while Redis holds
// scripts (pauseScripts), so that every leader slot is busy; their results
// arrive on the returned channel once Redis resumes.
func fillLeaders(t *testing.T, b *batcher, key string, r limiter.Rule) <-chan batchResult {
	t.Helper()
	res := make(chan batchResult, b.maxLeaders)
	for range b.maxLeaders {
		go decide(context.Background(), b, key, r, res)
	}
	waitFor(t, b, "every leader busy", func() bool { return b.leaders == b.maxLeaders })
	return res
}

// enqueue starts one decision on key with ctx and waits until the queue
// holds n decisions.
func enqueue(t *testing.T, ctx context.Context, b *batcher, key string, r limiter.Rule, n int) <-chan batchResult {
	t.Helper()
	res := make(chan batchResult, 1)
	go decide(ctx, b, key, r, res)
	waitFor(t, b, fmt.Sprintf("%d decisions queued", n), func() bool { return len(b.queue) == n })
	return res
}

// succeeded waits for n results on res and fails the test on an error.
func succeeded(t *testing.T, res <-chan batchResult, n int) {
	t.Helper()
	for range n {
		if got := <-res; got.err != nil {
			t.Fatal(got.err)
		}
	}
}

// While b.maxLeaders batches are in flight, later decisions queue, and the
// first leader to finish sends all of them as one script call.
func TestBatcherGroupsWhatQueuesWhileBusy(t *testing.T) {
	for _, inFlight := range []int{1, 0, 3} {
		t.Run(fmt.Sprintf("in_flight=%d", inFlight), func(t *testing.T) { testBatcherGroups(t, inFlight) })
	}
}

func testBatcherGroups(t *testing.T, inFlight int) {
	b, srv := newTestBatcher(t, inFlight)
	if want := cmp.Or(inFlight, defaultInFlight); b.maxLeaders != want {
		t.Fatalf("maxLeaders = %d, want %d", b.maxLeaders, want)
	}
	resume := pauseScripts(t, srv)
	const queued = 10
	r := limiter.Rule{Limit: 1000, Period: time.Hour}
	res := make(chan batchResult, b.maxLeaders+queued)
	for range b.maxLeaders {
		go decide(context.Background(), b, "{grp}:k", r, res)
	}
	waitFor(t, b, "every leader busy", func() bool { return b.leaders == b.maxLeaders })
	for range queued {
		go decide(context.Background(), b, "{grp}:k", r, res)
	}
	waitFor(t, b, "all followers queued", func() bool { return len(b.queue) == queued })
	if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	resume()

	var remaining []int
	for range b.maxLeaders + queued {
		got := <-res
		if got.err != nil {
			t.Fatal(got.err)
		}
		remaining = append(remaining, int(got.out.Remaining))
	}
	slices.Sort(remaining)
	for i, rem := range remaining {
		if want := 1000 - (b.maxLeaders + queued) + i; rem != want {
			t.Fatalf("remaining values %v: every decision must be counted once, in some order", remaining)
		}
	}
	if got, want := scriptCalls(t, srv), b.maxLeaders+1; got != want {
		t.Errorf("script calls = %d, want %d (one per leader, then one for the %d queued decisions)", got, want, queued)
	}
	waitFor(t, b, "no batch in flight", func() bool { return b.leaders == 0 && len(b.queue) == 0 })
}

// A promoted leader takes its batch when it runs, after its yield: a
// decision that queued between the promotion and then goes with it, not in
// a batch of its own a round trip later.
func TestBatcherLeaderTakesWhatQueuedBeforeItRan(t *testing.T) {
	b, srv := newTestBatcher(t, 1)
	r := limiter.Rule{Limit: 10, Period: time.Hour}
	late := make(chan batchResult, 1)
	yields := 0 // only the promoted leader's goroutine yields
	b.yield = func() {
		// The promoted leader is about to take its batch: one more
		// decision arrives first.
		if yields++; yields == 1 {
			go decide(context.Background(), b, "{late}:k", r, late)
			waitFor(t, b, "the late decision queued", func() bool { return len(b.queue) == 1 })
		}
	}
	resume := pauseScripts(t, srv)
	res := fillLeaders(t, b, "{late}:busy", r)
	first := enqueue(t, context.Background(), b, "{late}:k", r, 1)
	if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	resume()
	succeeded(t, res, 1)
	succeeded(t, first, 1)
	succeeded(t, late, 1)
	if got := scriptCalls(t, srv); got != 2 {
		t.Errorf("script calls = %d, want 2: the busy leader's, then one for the promoted leader and the decision that queued before it ran", got)
	}
	waitFor(t, b, "no batch in flight", func() bool { return b.leaders == 0 && len(b.queue) == 0 && b.pending == 0 })
}

// A decision whose context ends while it waits in the queue leaves it at
// once and is never sent: its hit is not counted.
func TestBatcherDropsCancelledQueuedDecision(t *testing.T) {
	b, srv := newTestBatcher(t, 0)
	resume := pauseScripts(t, srv)
	r := limiter.Rule{Limit: 10, Period: time.Hour}
	res := fillLeaders(t, b, "{drop}:busy", r)
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := enqueue(t, ctx, b, "{drop}:k", r, 1)
	kept := enqueue(t, context.Background(), b, "{drop}:k", r, 2)

	cancel()
	if got := <-gaveUp; !errors.Is(got.err, context.Canceled) {
		t.Fatalf("cancelled decision returned %+v, want context.Canceled", got)
	}
	waitFor(t, b, "the cancelled decision left the queue", func() bool { return len(b.queue) == 1 })
	resume()
	succeeded(t, res, b.maxLeaders)
	got := <-kept
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.out.Remaining != 9 {
		t.Errorf("remaining = %d, want 9: the cancelled decision must not have been counted", got.out.Remaining)
	}
}

// A queued decision past its deadline (REDIS_TIMEOUT after it arrived) when
// the queue is promoted is answered with a timeout and never sent; the
// decisions behind it go on.
func TestBatcherAnswersExpiredQueuedDecision(t *testing.T) {
	b, srv := newTestBatcher(t, 0)
	resume := pauseScripts(t, srv)
	r := limiter.Rule{Limit: 10, Period: time.Hour}
	res := fillLeaders(t, b, "{expire}:busy", r)
	expired := enqueue(t, context.Background(), b, "{expire}:k", r, 1)
	kept := enqueue(t, context.Background(), b, "{expire}:k", r, 2)
	// Its timeout has run out while Redis was stalled (set directly: the
	// test must not wait for a real timeout).
	b.mu.Lock()
	b.queue[0].deadline = time.Now().Add(-time.Millisecond)
	b.mu.Unlock()

	resume()
	succeeded(t, res, b.maxLeaders)
	if got := <-expired; !errors.Is(got.err, context.DeadlineExceeded) {
		t.Fatalf("expired queued decision returned %+v, want a deadline error", got)
	}
	got := <-kept
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.out.Remaining != 9 {
		t.Errorf("remaining = %d, want 9: the expired decision must not have been counted", got.out.Remaining)
	}
	waitFor(t, b, "no batch in flight", func() bool { return b.leaders == 0 && len(b.queue) == 0 })
}

// A leader's batch is bounded by the leader's own context (Envoy's deadline),
// not only by the batcher's timeout: a stalled Redis answers it with the
// context's error.
func TestBatcherLeaderDeadlineBoundsItsBatch(t *testing.T) {
	srv := redistest.Start(t)
	// A client timeout far beyond the guard below and no deadline: only the
	// leader's context can end the call in time.
	c, err := NewClient(ClientOptions{URL: srv.Addr, Type: "single", PoolSize: 4, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := newRunner(c)
	if err := r.load(context.Background()); err != nil {
		t.Fatal(err)
	}
	b := newBatcher(r, true, Options{})
	pauseScripts(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	res := make(chan batchResult, 1)
	go decide(ctx, b, "{deadline}:k", limiter.Rule{Limit: 10, Period: time.Hour}, res)
	select {
	case got := <-res:
		// go-redis turns the context's deadline into the connection's.
		var ne net.Error
		if !errors.Is(got.err, context.DeadlineExceeded) && !(errors.As(got.err, &ne) && ne.Timeout()) {
			t.Fatalf("leader with a stalled Redis returned %+v, want a timeout", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the leader's deadline did not end its batch")
	}
}

// REDIS_TIMEOUT (Options.Timeout) bounds a batched Apply although no
// context carries it: the deadline travels with the call.
func TestBatchedApplyEndsAtTimeout(t *testing.T) {
	srv := redistest.Start(t)
	c, err := NewClient(ClientOptions{URL: srv.Addr, Type: "single", PoolSize: 4, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c, Options{Batch: true, Timeout: 50 * time.Millisecond})
	pauseScripts(t, srv)
	res := make(chan error, 1)
	go func() {
		_, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: "{timeout}:k", Rule: limiter.Rule{Limit: 10, Period: time.Hour}, Cost: 1}}})
		res <- err
	}()
	select {
	case err := <-res:
		var ne net.Error
		if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()) {
			t.Fatalf("Apply against a stalled Redis returned %v, want a timeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("REDIS_TIMEOUT did not end a batched Apply")
	}
}

// A batch whose leader's client went away (its context cancelled) still
// answers the decisions it carries for others.
func TestBatcherLeaderCancellationSparesItsBatch(t *testing.T) {
	b, _ := newTestBatcher(t, 0)
	r := limiter.Rule{Limit: 10, Period: time.Hour}
	mk := func(key string) *call {
		h := &limiter.Hit{Key: key, Rule: r, Cost: 1}
		c := scriptCall([]string{keyVersion + key}, scriptArg(redisTime, time.Now(), modeEach, []*limiter.Hit{h}, nil, 0))
		c.done = make(chan struct{}, 1)
		return c
	}
	leader, follower := mk("{cancel}:leader"), mk("{cancel}:follower")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b.mu.Lock()
	b.leaders++ // as send does before leading
	b.mu.Unlock()
	b.lead(ctx, []*call{leader, follower})
	<-follower.done
	if err := follower.failure(); err != nil {
		t.Fatalf("follower in a cancelled leader's batch failed: %v", err)
	}
	outs, err := parseOutcomes(follower.route.(*scriptRoute).reply, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !outs[0].Allowed || outs[0].Remaining != 9 {
		t.Errorf("follower outcome = %+v, want allowed with 9 remaining", outs[0])
	}
}

// A decision of more than heavyKeys keys never joins a batch: while every
// leader is busy it does not queue behind them (nor would a light decision
// be merged with it) but goes to Redis at once, alone.
func TestBatcherSendsHeavyDecisionsAlone(t *testing.T) {
	b, srv := newTestBatcher(t, 1)
	pauseScripts(t, srv)
	r := limiter.Rule{Limit: 1000, Period: time.Hour}
	fillLeaders(t, b, "{h}:lead", r)
	enqueue(t, context.Background(), b, "{h}:light", r, 1)

	hits := make([]*limiter.Hit, heavyKeys+1)
	keys := make([]string, len(hits))
	for i := range hits {
		hits[i] = &limiter.Hit{Key: fmt.Sprintf("{h}:heavy%d", i), Rule: r, Cost: 1}
		keys[i] = keyVersion + hits[i].Key
	}
	// Redis holds scripts, so the heavy decision, sent at once, ends at its
	// own deadline; had it queued, the queue would hold two.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		c := scriptCall(keys, scriptArg(redisTime, time.Now(), modeEach, hits, nil, 0))
		b.send(ctx, time.Time{}, c)
		done <- c.failure()
	}()
	for {
		select {
		case err := <-done:
			var ne net.Error
			if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()) {
				t.Errorf("heavy decision against a paused Redis = %v, want a timeout in Redis", err)
			}
			return
		default:
		}
		b.mu.Lock()
		queued := len(b.queue)
		b.mu.Unlock()
		if queued > 1 {
			t.Fatal("the heavy decision queued behind the batches")
		}
		time.Sleep(time.Millisecond) // polling the batcher's state
	}
}
