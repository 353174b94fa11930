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
}

type overEntry struct {
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
	c.mu.Unlock()
	if !ok || h.Refund || !now.Before(e.until) || e.rule != h.Rule || h.Cost < e.minCost {
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
	}
	c.m[h.Key] = overEntry{rule: h.Rule, minCost: h.Cost, remaining: out.Remaining,
		until: now.Add(out.RetryAfter), resetAt: now.Add(out.ResetAfter)}
}

// len is how many keys the cache holds.
func (c *overCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
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
		}
	}
}
