// Package memcache is the memcache store (BACKEND_TYPE=memcache): counters
// in one or more memcached servers, each key on the server
// envoyproxy/ratelimit picks for it (the CRC-32 of the key modulo the
// number of servers, as its memcache client, the same library, picks), so
// replicas agree on where a key lives.
//
// What is exact, and how:
//   - A fixed window's count is an integer per window, changed only by
//     memcached's atomic incr and decr. A hit increments first and is
//     decided on the count before its own increment, as the atomic step
//     would decide it in the increments' order; what it should not have
//     counted (a rejected hit under REJECTED_HITS=drop) is taken back by a
//     decr at once. No window ever admits past its limit; while a hit that
//     is being taken back is counted, a concurrent hit of another cost can
//     see too high a count and be rejected (never admitted wrongly).
//   - Every other algorithm keeps its state as bytes (limiter.Eval),
//     replaced by compare-and-swap (gets, then cas): exact, retried on
//     conflict up to a bound, then an error the failure policy answers.
//   - A batch that is all or nothing across keys
//     (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT) is checked, then counted
//     (limiter.CheckThenCount), as across Redis Cluster slots: memcache has
//     no step spanning keys, so a concurrent request can slip in between.
//
// The clock is the replica's (memcached has none to share): replicas must
// keep theirs in sync, as for any windowed limit.
package memcache

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/openrls/ratelimit/src/limiter"
)

// Options configures a Store.
type Options struct {
	// Servers are memcached addresses, host:port (MEMCACHE_HOST_PORT); empty
	// when the servers come from SRV records (SetServers).
	Servers []string
	// Prefix starts every key (CACHE_KEY_PREFIX).
	Prefix string
	// Timeout bounds each network operation; 0 means 1s.
	Timeout time.Duration
	// MaxIdleConns is the idle connections kept per server; 0 means 2.
	MaxIdleConns int
	// TLS, when set, speaks TLS to every server.
	TLS *tls.Config
	// Clock is the time hits are counted at when a batch does not say; nil
	// means time.Now.
	Clock func() time.Time
	// ExpirationJitter, when positive, lengthens every key's expiry by a
	// random whole number of seconds below it, per key
	// (EXPIRATION_JITTER_MAX_SECONDS), so that keys of one window do not
	// all expire at one instant. It changes no count: a key names its
	// window.
	ExpirationJitter time.Duration
}

// Store is a limiter.Store on memcached. It is safe for concurrent use.
type Store struct {
	client  *memcache.Client
	servers *memcache.ServerList
	prefix  string
	clock   func() time.Time
	jitter  int64 // Options.ExpirationJitter in whole seconds; 0: none
}

// casAttempts bounds the compare-and-swap retries of one hit: past it the
// hit fails (the failure policy answers) rather than hold a request.
const casAttempts = 64

// keyPrefix versions the keys' format.
const keyPrefix = "rl:m1:"

// maxKeyBytes is memcached's limit on a key.
const maxKeyBytes = 250

// New returns a Store on o's servers.
func New(o Options) (*Store, error) {
	s := &Store{servers: &memcache.ServerList{}, prefix: o.Prefix, clock: o.Clock, jitter: max(int64(o.ExpirationJitter/time.Second), 0)}
	if s.clock == nil {
		s.clock = time.Now
	}
	if err := s.SetServers(o.Servers...); err != nil {
		return nil, err
	}
	s.client = memcache.NewFromSelector(s.servers)
	s.client.Timeout = o.Timeout
	if s.client.Timeout <= 0 {
		s.client.Timeout = time.Second
	}
	s.client.MaxIdleConns = o.MaxIdleConns
	if o.TLS != nil {
		cfg := o.TLS
		timeout := s.client.Timeout
		s.client.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			d := tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout}, Config: cfg}
			return d.DialContext(ctx, network, addr)
		}
	}
	return s, nil
}

// SetServers replaces the servers (an SRV refresh). Keys move with the
// hashing: a key whose server changed starts from an empty count there.
func (s *Store) SetServers(addrs ...string) error {
	for _, a := range addrs {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			return fmt.Errorf("memcache: server %q: want host:port", a)
		}
	}
	if err := s.servers.SetServers(addrs...); err != nil {
		return fmt.Errorf("memcache: servers %v: %w", addrs, err)
	}
	return nil
}

// Ping checks every server.
func (s *Store) Ping(context.Context) error {
	if err := s.client.Ping(); err != nil {
		return fmt.Errorf("memcache: %w", err)
	}
	return nil
}

// Close drops the idle connections.
func (s *Store) Close() { _ = s.client.Close() }

// Apply implements limiter.Store.
func (s *Store) Apply(ctx context.Context, b limiter.Batch) ([]limiter.Outcome, error) {
	now := b.Now
	if now.IsZero() {
		now = s.clock()
	}
	if b.DryRun {
		return s.check(ctx, b.Hits, now)
	}
	if !b.AllOrNothing || len(b.Hits) == 1 {
		// One hit is all or nothing by itself.
		return s.applyEach(ctx, b.Hits, now)
	}
	return limiter.CheckThenCount(b, func(step limiter.Step, checked []limiter.Outcome) ([]limiter.Outcome, error) {
		switch step {
		case limiter.StepCheck:
			return s.check(ctx, b.Hits, now)
		case limiter.StepReports:
			var idx []int
			var part []limiter.Hit
			for i := range b.Hits {
				if b.Hits[i].Reports(checked[i]) {
					idx, part = append(idx, i), append(part, b.Hits[i])
				}
			}
			got, err := s.applyEach(ctx, part, now)
			if err != nil {
				return nil, err
			}
			for j, i := range idx {
				checked[i] = got[j]
			}
			return checked, nil
		}
		return s.applyEach(ctx, b.Hits, now)
	})
}

// applyEach applies the hits one after the other, each atomically.
func (s *Store) applyEach(ctx context.Context, hits []limiter.Hit, now time.Time) ([]limiter.Outcome, error) {
	outs := make([]limiter.Outcome, len(hits))
	for i := range hits {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		h := &hits[i]
		var err error
		if h.Rule.Algorithm == limiter.FixedWindow {
			outs[i], err = s.applyFixed(h, now)
		} else {
			outs[i], err = s.applyCAS(ctx, h, now)
		}
		if err != nil {
			return nil, fmt.Errorf("memcache: apply %d hits: %w", len(hits), err)
		}
	}
	return outs, nil
}

// applyFixed counts a fixed-window hit by incr, decides it on the count
// before its own increment, and takes back what it should not count.
func (s *Store) applyFixed(h *limiter.Hit, now time.Time) (limiter.Outcome, error) {
	key, exp := s.windowKey(h, now)
	if h.Cost == 0 {
		before, err := s.count(key)
		if err != nil {
			return limiter.Outcome{}, err
		}
		_, out, _ := limiter.EvalFixed(before, now, h.Rule, 0, false)
		return out, nil
	}
	if h.Refund {
		after, err := s.client.Decrement(key, h.Cost)
		if errors.Is(err, memcache.ErrCacheMiss) {
			_, out, _ := limiter.EvalFixed(0, now, h.Rule, h.Cost, true)
			return out, nil
		} else if err != nil {
			return limiter.Outcome{}, err
		}
		// What is left after it, as the refund's step reports it.
		_, out, _ := limiter.EvalFixed(after, now, h.Rule, 0, true)
		out.Allowed, out.RetryAfter = true, 0
		return out, nil
	}
	delta := min(h.Cost, limiter.MaxCount)
	c, err := s.incr(key, delta, s.exptime(now, exp))
	if err != nil {
		return limiter.Outcome{}, err
	}
	before := c - delta
	after, out, write := limiter.EvalFixed(before, now, h.Rule, h.Cost, false)
	if !write {
		after = before
	}
	if c > after {
		if _, err := s.client.Decrement(key, c-after); err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
			return limiter.Outcome{}, fmt.Errorf("take back %d: %w", c-after, err)
		}
	}
	return out, nil
}

// incr adds delta to key's count, creating it (expiring at exptime) when
// missing, and returns the count after.
func (s *Store) incr(key string, delta uint64, exptime int32) (uint64, error) {
	for range 3 {
		c, err := s.client.Increment(key, delta)
		if !errors.Is(err, memcache.ErrCacheMiss) {
			return c, err
		}
		err = s.client.Add(&memcache.Item{Key: key, Value: []byte(strconv.FormatUint(delta, 10)), Expiration: exptime})
		if err == nil {
			return delta, nil
		}
		if !errors.Is(err, memcache.ErrNotStored) {
			return 0, err
		}
		// Another replica created it first: increment that.
	}
	return 0, errors.New("incr: the key kept vanishing between incr and add")
}

// count reads a fixed window's count; a missing key is 0.
func (s *Store) count(key string) (uint64, error) {
	it, err := s.client.Get(key)
	if errors.Is(err, memcache.ErrCacheMiss) {
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	// decr may leave the number space-padded (memcached keeps the length).
	n, err := strconv.ParseUint(strings.TrimRight(string(it.Value), " "), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("count of %s is not a number", key)
	}
	return n, nil
}

// applyCAS applies a hit of a state-keeping algorithm by compare-and-swap.
func (s *Store) applyCAS(ctx context.Context, h *limiter.Hit, now time.Time) (limiter.Outcome, error) {
	key := s.key(h.Key, "")
	for attempt := range casAttempts {
		it, err := s.client.Get(key)
		missing := errors.Is(err, memcache.ErrCacheMiss)
		if err != nil && !missing {
			return limiter.Outcome{}, err
		}
		var prev []byte
		if !missing {
			prev = it.Value
		}
		next, out, expires, write := limiter.Eval(prev, now, h.Rule, h.Cost, h.Refund)
		if !write {
			return out, nil
		}
		exp := s.exptime(now, expires)
		if missing {
			err = s.client.Add(&memcache.Item{Key: key, Value: next, Expiration: exp})
		} else {
			it.Value, it.Expiration = next, exp
			err = s.client.CompareAndSwap(it)
		}
		switch {
		case err == nil:
			return out, nil
		case errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrNotStored), errors.Is(err, memcache.ErrCacheMiss):
			// Another write came first: read again, after a pause that
			// grows with the attempts, so that writers spread out.
			if err := ctx.Err(); err != nil {
				return limiter.Outcome{}, err
			}
			time.Sleep(time.Duration(rand.Int64N(int64(attempt+1) * int64(50*time.Microsecond))))
		default:
			return limiter.Outcome{}, err
		}
	}
	return limiter.Outcome{}, fmt.Errorf("%d writers in a row changed %s first", casAttempts, key)
}

// check decides the hits as if counted, writing nothing (Batch.DryRun): a
// key that appears twice sees its first hit, and a hit that would be
// written reports what a cost of 0 sees, with its own decision.
func (s *Store) check(ctx context.Context, hits []limiter.Hit, now time.Time) ([]limiter.Outcome, error) {
	// seen is a key as the batch sees it so far, and as stored.
	type seen struct {
		count, storedCount uint64 // fixed windows
		state, storedState []byte // the others
	}
	latest := map[string]*seen{}
	outs := make([]limiter.Outcome, len(hits))
	for i := range hits {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		h := &hits[i]
		fixed := h.Rule.Algorithm == limiter.FixedWindow
		key := s.key(h.Key, "")
		if fixed {
			key, _ = s.windowKey(h, now)
		}
		sn := latest[key]
		if sn == nil {
			sn = &seen{}
			var err error
			if fixed {
				sn.count, err = s.count(key)
			} else {
				sn.state, err = s.stateOf(key)
			}
			if err != nil {
				return nil, fmt.Errorf("memcache: check %d hits: %w", len(hits), err)
			}
			sn.storedCount, sn.storedState = sn.count, sn.state
			latest[key] = sn
		}
		var out, zero limiter.Outcome
		var write bool
		if fixed {
			var after uint64
			after, out, write = limiter.EvalFixed(sn.count, now, h.Rule, h.Cost, h.Refund)
			if write {
				sn.count = after
				_, zero, _ = limiter.EvalFixed(sn.storedCount, now, h.Rule, 0, false)
			}
		} else {
			var next []byte
			next, out, _, write = limiter.Eval(sn.state, now, h.Rule, h.Cost, h.Refund)
			if write {
				sn.state = next
				_, zero, _, _ = limiter.Eval(sn.storedState, now, h.Rule, 0, false)
			}
		}
		if write {
			zero.Allowed, zero.RetryAfter = out.Allowed, out.RetryAfter
			out = zero
		}
		outs[i] = out
	}
	return outs, nil
}

// stateOf reads a key's encoded state; a missing key is nil.
func (s *Store) stateOf(key string) ([]byte, error) {
	it, err := s.client.Get(key)
	if errors.Is(err, memcache.ErrCacheMiss) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	return it.Value, nil
}

// windowKey is the key of h's fixed window at now, and when the window
// ends.
func (s *Store) windowKey(h *limiter.Hit, now time.Time) (string, time.Time) {
	w, end := limiter.FixedWindowAt(now, h.Rule)
	return s.key(h.Key, ":"+strconv.FormatInt(w, 10)), end
}

// key is the memcache key of a counter: the prefix, the format's version
// and the counter's key, or, when that is longer than memcached allows or
// holds bytes its protocol cannot carry (spaces, control bytes), its
// SHA-256 in their place.
func (s *Store) key(counter, suffix string) string {
	k := s.prefix + keyPrefix + counter + suffix
	if len(k) <= maxKeyBytes && legal(k) {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	return keyPrefix + "h:" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// legal reports whether k holds only bytes memcached's text protocol
// carries in a key.
func legal(k string) bool {
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}

// maxRelative is the longest expiry memcached reads as seconds from now;
// a longer one must be a Unix time.
const maxRelative = 30 * 24 * 60 * 60

// exptime is memcached's expiry for a state that expires at expires, seen
// at now: a second late rather than early. memcached counts from its own
// clock, so a batch counted ahead of ours (a reservation for a coming
// window) is measured from ours, or its key would go before its window.
func (s *Store) exptime(now, expires time.Time) int32 {
	if real := s.clock(); now.After(real) {
		now = real
	}
	secs := int64(math.Ceil(expires.Sub(now).Seconds())) + 1
	if secs < 1 {
		secs = 1
	}
	if s.jitter > 0 {
		secs += rand.Int64N(s.jitter)
	}
	if secs <= maxRelative {
		return int32(secs)
	}
	return int32(min(s.clock().Unix()+secs, math.MaxInt32))
}
