package redis

import (
	"sync"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

// overCache remembers keys known to be over their limit until an instant, so
// that a flood of rejected requests does not reach Redis. It only ever
// answers "rejected": a key it does not know, or knows for a different rule or
// a smaller cost, goes to Redis. It is bounded by an approximate byte budget;
// when full it drops expired entries and otherwise declines new ones (which
// only costs a Redis call). It is safe for concurrent use.
type overCache struct {
	mu     sync.Mutex
	m      map[string]overEntry
	bytes  int
	budget int
	nextGC time.Time
	// expired and overwritten count entries dropped for their time and
	// entries replaced by a newer answer for the same key (the
	// reference's localcache.expiredCount and overwriteCount).
	expired, overwritten uint64
}

// CacheStats are the local cache's figures as envoyproxy/ratelimit
// names them (ratelimit.localcache.*). It never drops a live entry to
// make room (a new one is declined instead), so it has no evacuations.
type CacheStats struct {
	Entries, Expired, Overwritten uint64
	// AverageAccess is the mean, over the entries held, of when each last
	// answered or was stored (unix seconds; 0 when empty).
	AverageAccess uint64
}

type overEntry struct {
	access    int64 // when it last answered, or was stored (unix seconds)
	rule      limiter.Rule
	minCost   uint64
	remaining uint64
	until     time.Time // the hit cannot pass before this
	resetAt   time.Time
}

// entryOverhead approximates a map entry's memory beside its key.
const entryOverhead = 96

func newOverCache(budget int) *overCache {
	return &overCache{m: map[string]overEntry{}, budget: budget}
}

func (c *overCache) get(h *limiter.Hit, now time.Time) (limiter.Outcome, bool) {
	c.mu.Lock()
	e, ok := c.m[h.Key]
	answers := ok && !h.Refund && now.Before(e.until) && e.rule == h.Rule && h.Cost >= e.minCost
	if answers && e.access != now.Unix() {
		e.access = now.Unix()
		c.m[h.Key] = e
	}
	c.mu.Unlock()
	if !answers {
		return limiter.Outcome{}, false
	}
	return limiter.Outcome{
		Remaining:  e.remaining,
		ResetAfter: max(e.resetAt.Sub(now), 0),
		RetryAfter: e.until.Sub(now),
		Cached:     true,
	}, true
}

func (c *overCache) put(h *limiter.Hit, out limiter.Outcome, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	size := len(h.Key) + entryOverhead
	if _, exists := c.m[h.Key]; !exists && c.bytes+size > c.budget {
		if now.Before(c.nextGC) {
			return
		}
		c.sweep(now)
		if c.bytes+size > c.budget {
			return
		}
	}
	if _, exists := c.m[h.Key]; !exists {
		c.bytes += size
	} else {
		c.overwritten++
	}
	c.m[h.Key] = overEntry{access: now.Unix(), rule: h.Rule, minCost: h.Cost, remaining: out.Remaining,
		until: now.Add(out.RetryAfter), resetAt: now.Add(out.ResetAfter)}
}

// drop forgets key.
func (c *overCache) drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[key]; ok {
		delete(c.m, key)
		c.bytes -= len(key) + entryOverhead
	}
}

// sweep drops expired entries; at most once a second, so a full cache of
// live entries does not turn every rejection into a full scan.
func (c *overCache) sweep(now time.Time) {
	c.nextGC = now.Add(time.Second)
	for k, e := range c.m {
		if !now.Before(e.until) {
			delete(c.m, k)
			c.bytes -= len(k) + entryOverhead
			c.expired++
		}
	}
}

// stats reads the cache's figures, the average over every entry held.
func (c *overCache) stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := CacheStats{Entries: uint64(len(c.m)), Expired: c.expired, Overwritten: c.overwritten}
	if len(c.m) > 0 {
		var sum float64
		for _, e := range c.m {
			sum += float64(e.access)
		}
		st.AverageAccess = uint64(sum / float64(len(c.m)))
	}
	return st
}
