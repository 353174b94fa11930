package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/openrls/ratelimit/src/limiter"
)

// Options configures a Store. The zero value is usable.
type Options struct {
	// Prefix is prepended to every key (CACHE_KEY_PREFIX). It must not
	// contain braces: they would move the Cluster hash tag.
	Prefix string
	// LocalCacheBytes sizes the local over-limit cache; 0 turns it off.
	LocalCacheBytes int
	// Clock is the local time: the local over-limit cache's when a Batch
	// has no Now, and the leases' (when each lease is renewed, and when an
	// idle one is given back); nil means time.Now. Without a Batch.Now,
	// windows are named by Redis's clock (TIME), not this one.
	Clock func() time.Time
	// Timeout bounds one Apply, all round trips included (REDIS_TIMEOUT);
	// 0 means only the caller's context bounds it.
	Timeout time.Duration
	// Batch batches the script calls of concurrent decisions (see
	// batcher.go; REDIS_PIPELINE_WINDOW > 0): a decision never waits for a
	// batch to fill; what queues while earlier batches are in flight goes
	// out together, up to BatchLimit decisions (0: 128), with at most
	// BatchInFlight batches in flight (0: 1). Without it each decision is
	// sent on its own connection.
	Batch         bool
	BatchLimit    int
	BatchInFlight int
	// LeaseInterval turns leased budgets on for rules with a lease (see
	// lease.go): a slice is sized to last this long at the replica's
	// recent rate on its key. 0 decides every hit in Redis.
	LeaseInterval time.Duration
	// LeaseIdle is how long a slice may go unused before it is given
	// back (0: DefaultLeaseIdle); the sweep that does it runs twice per
	// LeaseIdle.
	LeaseIdle time.Duration
	// ExpirationJitter, when positive, lengthens the TTL of every key a
	// decision creates or re-arms by a random amount below it
	// (EXPIRATION_JITTER_MAX_SECONDS), drawn per decision, so that keys
	// of one window do not all expire at one instant. It changes no count:
	// every key's state names its window or instant.
	ExpirationJitter time.Duration
}

// DefaultLeaseIdle is Options.LeaseIdle's default.
const DefaultLeaseIdle = time.Second

// Store is the Redis limiter.Store. An Apply is one round trip, a single
// script call over all keys on a single node or Sentinel, one pipeline per
// node in Cluster mode, or plain commands in a transaction for the default
// fixed window (plain.go), with three exceptions: an all-or-nothing batch
// over several Cluster nodes checks every node, then counts (two round
// trips), a leased batch first gives back slices it must (leasepath.go),
// and a plain hit whose window, picked by an estimate of Redis's clock,
// turned out not to be the one Redis's clock was in is decided again by
// the function (plain.go). It is safe for concurrent use.
type Store struct {
	client    goredis.UniversalClient
	runner    *runner
	cluster   bool
	prefix    string
	cache     *overCache
	cacheHits atomic.Uint64
	// cacheMisses counts hits the local cache was asked about and could
	// not answer.
	cacheMisses atomic.Uint64
	clock       func() time.Time
	rclock      *redisClock // Redis's clock, for plain decisions (plain.go)
	plainOff    atomic.Bool // Redis refused a plain command: the function only
	plainOK     atomic.Bool // plainProbe found the plain commands allowed
	probeMu     sync.Mutex  // held by the one probe in flight
	lastProbe   time.Time   // guarded by probeMu
	timeout     time.Duration
	jitterMS    int64    // Options.ExpirationJitter in ms; 0: none
	batch       *batcher // nil when pipelining is off
	leases      *leases  // nil when leasing is off
	stop        context.CancelFunc
	swept       chan struct{} // closed when the lease sweeper has stopped
}

// jitter is one decision's extra TTL, in ms: uniform below jitterMS.
func (s *Store) jitter() int64 {
	if s.jitterMS <= 0 {
		return 0
	}
	return rand.Int64N(s.jitterMS)
}

// CacheHits returns how many hits the local over-limit cache answered.
func (s *Store) CacheHits() uint64 { return s.cacheHits.Load() }

// CacheMisses returns how many hits the local over-limit cache was asked
// about and could not answer (they went to Redis).
func (s *Store) CacheMisses() uint64 { return s.cacheMisses.Load() }

// CacheStats returns the local over-limit cache's figures (zero when
// there is none).
func (s *Store) CacheStats() CacheStats {
	if s.cache == nil {
		return CacheStats{}
	}
	return s.cache.stats()
}

// New returns a Store over client. It does not contact Redis: the service
// must start even while Redis is down, and recover when it comes back.
func New(client goredis.UniversalClient, opts Options) (*Store, error) {
	if strings.ContainsAny(opts.Prefix, "{}") {
		return nil, fmt.Errorf("redis: key prefix %q must not contain { or }", opts.Prefix)
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	_, cluster := client.(*goredis.ClusterClient)
	s := &Store{client: client, runner: newRunner(client), cluster: cluster, prefix: opts.Prefix + keyVersion, clock: opts.Clock,
		rclock: &redisClock{client: client}, timeout: opts.Timeout,
		jitterMS: max(opts.ExpirationJitter.Milliseconds(), 0)}
	if opts.LocalCacheBytes > 0 {
		s.cache = newOverCache(opts.LocalCacheBytes)
	}
	if opts.Batch {
		s.batch = newBatcher(s.runner, !cluster, opts)
	}
	if opts.LeaseInterval > 0 {
		if opts.LeaseIdle <= 0 {
			opts.LeaseIdle = DefaultLeaseIdle
		}
		s.leases = newLeases(opts.LeaseInterval, opts.LeaseIdle, opts.Clock)
		ctx, stop := context.WithCancel(context.Background())
		s.stop, s.swept = stop, make(chan struct{})
		go s.sweepEvery(ctx, opts.LeaseIdle/2)
	}
	return s, nil
}

// Close gives every slice back to Redis (within the store's timeout) and
// stops the sweeper. It does not close the client, which the caller owns.
func (s *Store) Close() {
	if s.leases == nil {
		return
	}
	s.stop()
	<-s.swept
	s.sweep(0)
}

// Preload loads the script and the function library (on every master of a
// Cluster) so that the first request does not pay for them. Failing is
// harmless: what is missing is loaded on first use.
func (s *Store) Preload(ctx context.Context) error { return s.runner.load(ctx) }

// FunctionsRefused is Redis's answer to FUNCTION LOAD when it says the
// library can never load there (Redis before 7, an ACL without FUNCTION):
// decisions then run as a script, at a higher cost per call. Nil otherwise.
func (s *Store) FunctionsRefused() error {
	if err := s.runner.refused.Load(); err != nil {
		return *err
	}
	return nil
}

// Ping reports whether Redis answers.
func (s *Store) Ping(ctx context.Context) error { return s.client.Ping(ctx).Err() }

// Apply implements limiter.Store.
func (s *Store) Apply(ctx context.Context, b limiter.Batch) ([]limiter.Outcome, error) {
	if s.leases != nil && leased(b) {
		return s.applyLeased(ctx, b)
	}
	outs, _, err := s.apply(ctx, b, nil)
	return outs, err
}

// apply runs b in Redis. wants, when not nil, holds each hit's lease
// parameter; the slices granted come back in grants, by hit.
func (s *Store) apply(ctx context.Context, b limiter.Batch, wants []uint64) (outs []limiter.Outcome, grants []grant, err error) {
	outs = make([]limiter.Outcome, len(b.Hits))
	now := int64(redisTime)
	if !b.Now.IsZero() {
		now = b.Now.UnixMicro()
	}
	localNow := b.Now
	if localNow.IsZero() {
		localNow = s.clock()
	}
	mode := batchMode(b)
	groups, cachedReject := s.groups(b, outs, localNow, wants)
	if cachedReject {
		// A rejection known from the local cache: the request is
		// rejected anyway, so nothing is counted.
		mode = modeDryRun
	}
	if len(groups) == 0 {
		return outs, nil, nil
	}
	var deadline time.Time
	if s.timeout > 0 {
		deadline = time.Now().Add(s.timeout)
		if s.batch == nil {
			// (Batched, the deadline travels as a value instead: no timer
			// per decision.)
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, deadline)
			defer cancel()
		}
	}
	if s.cluster && len(groups) > 1 && mode == modeAllOrNothing {
		out, err := s.applyAcrossSlots(ctx, deadline, now, b, groups, outs, localNow)
		if err != nil {
			return nil, nil, err
		}
		return out, collectGrants(groups, len(b.Hits)), nil
	}
	if err := s.applyGroups(ctx, deadline, now, mode, groups, outs); err != nil {
		return nil, nil, err
	}
	s.remember(b.Hits, outs, localNow)
	return outs, collectGrants(groups, len(b.Hits)), nil
}

// batchMode is the script mode b asks for.
func batchMode(b limiter.Batch) scriptMode {
	switch {
	case b.DryRun:
		return modeDryRun
	case b.AllOrNothing:
		return modeAllOrNothing
	}
	return modeEach
}

// applyAcrossSlots decides an all-or-nothing batch whose groups live in
// several Cluster slots: checked first, then counted if all are allowed.
func (s *Store) applyAcrossSlots(ctx context.Context, deadline time.Time, now int64, b limiter.Batch, groups []*group,
	outs []limiter.Outcome, localNow time.Time) ([]limiter.Outcome, error) {
	// Slots cannot share a script (see docs/stores.md, "Redis Cluster").
	counted := false
	out, err := limiter.CheckThenCount(b, func(step limiter.Step, _ []limiter.Outcome) ([]limiter.Outcome, error) {
		switch step {
		case limiter.StepCheck:
			return outs, s.applyGroups(ctx, deadline, now, modeDryRun, groups, outs)
		case limiter.StepReports:
			counted = true
			return outs, s.applyGroups(ctx, deadline, now, modeEach, reportGroups(groups, outs), outs)
		}
		counted = true
		return outs, s.applyGroups(ctx, deadline, now, modeAllOrNothing, groups, outs)
	})
	if err != nil {
		return nil, err
	}
	if counted {
		s.remember(b.Hits, out, localNow)
	}
	return out, nil
}

// applyGroups sends the groups' calls in one round trip and fills outs. Plain
// hits that must be decided again (plain.go) take a second, as the
// function's. ctx ends at deadline unless batching is on (see Apply).
func (s *Store) applyGroups(ctx context.Context, deadline time.Time, now int64, mode scriptMode, groups []*group, outs []limiter.Outcome) error {
	calls := make([]*call, len(groups))
	for i, g := range groups {
		calls[i] = s.route(ctx, now, mode, g, true)
	}
	again, err := s.sendAndAnswer(ctx, deadline, calls, groups, outs)
	if len(again) == 0 || err != nil {
		return err
	}
	// The function decides them on Redis's clock; the estimate that
	// picked their windows is read again.
	s.rclock.stale()
	calls = calls[:0]
	for _, g := range again {
		calls = append(calls, s.route(ctx, now, mode, g, false))
	}
	_, err = s.sendAndAnswer(ctx, deadline, calls, again, outs)
	return err
}

// sendAndAnswer sends calls (one per group) and puts their answers into
// outs; it returns the groups to decide again by the function: hits a
// plain call could not answer, and those of a plain call Redis refused
// for good (the plain path is then off).
func (s *Store) sendAndAnswer(ctx context.Context, deadline time.Time, calls []*call, groups []*group, outs []limiter.Outcome) ([]*group, error) {
	s.send(ctx, deadline, calls)
	var again []*group
	var repairs []repair
	var first error
	for i, g := range groups {
		c := calls[i]
		var err error
		switch failed := c.failure(); {
		case failed != nil && c.route.refusedForGood(failed):
			s.plainOff.Store(true)
			again = append(again, g)
		case failed != nil:
			err = fmt.Errorf("redis: apply %d hits: %w", len(g.hits), failed)
		default:
			var late *group
			if late, err = c.route.answer(g, outs, &repairs); late != nil {
				again = append(again, late)
			}
		}
		if first == nil {
			first = err
		}
	}
	if len(repairs) > 0 {
		sendRepairs(s.client, repairs)
	}
	return again, first
}

// send sends the calls, through the batcher when batching is on, and sets
// each call's answer.
func (s *Store) send(ctx context.Context, deadline time.Time, calls []*call) {
	if s.batch != nil {
		s.sendBatched(ctx, deadline, calls)
	} else {
		s.runner.send(ctx, false, calls)
	}
}

// sendBatched hands the calls to the batcher, which pipelines them with
// other decisions' calls, and sets each call's answer.
func (s *Store) sendBatched(ctx context.Context, deadline time.Time, calls []*call) {
	if len(calls) == 1 {
		s.batch.send(ctx, deadline, calls[0])
		return
	}
	var wg sync.WaitGroup
	for _, c := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.batch.send(ctx, deadline, c)
		}()
	}
	wg.Wait()
}

// remember puts fresh rejections into the local cache.
func (s *Store) remember(hits []limiter.Hit, outs []limiter.Outcome, now time.Time) {
	if s.cache == nil || now.After(s.clock()) {
		// A batch counted ahead (a reservation for a coming window) says
		// nothing of the window in force now.
		return
	}
	for i := range hits {
		switch h := &hits[i]; {
		case h.Refund:
			// Budget came back: a remembered rejection may no longer hold.
			s.cache.drop(h.Key)
		case h.Rule.Overdraft:
			// Every overdraft hit must reach Redis to be counted.
		case h.Rule.Algorithm == limiter.Concurrency:
			// A release through another replica frees a slot at any
			// moment: a full count says nothing of the next instant.
		case !outs[i].Allowed && outs[i].RetryAfter > 0:
			s.cache.put(h, outs[i], now)
		}
	}
}
