package redis

import (
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

// TestOverCacheStats: the figures sent as the reference's
// ratelimit.localcache.* gauges count what they name: a key answered again
// is an overwrite, a sweep's drops are expirations, and the average access
// time is the mean of when each entry last answered or was stored.
func TestOverCacheStats(t *testing.T) {
	c := newOverCache(1 << 20)
	r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 1, Period: time.Minute}
	t0 := time.Unix(1_700_000_000, 0)
	over := limiter.Outcome{RetryAfter: 10 * time.Second, ResetAfter: 10 * time.Second}
	a, b := &limiter.Hit{Key: "a", Rule: r, Cost: 1}, &limiter.Hit{Key: "b", Rule: r, Cost: 1}
	c.put(a, over, t0)
	c.put(b, over, t0.Add(2*time.Second))
	if got := c.stats(); got != (CacheStats{Entries: 2, AverageAccess: uint64(t0.Unix() + 1)}) {
		t.Fatalf("two entries: %+v", got)
	}
	if _, ok := c.get(a, t0.Add(4*time.Second)); !ok {
		t.Fatal("the cache did not answer a")
	}
	c.put(b, over, t0.Add(4*time.Second)) // b again: an overwrite
	if got := c.stats(); got != (CacheStats{Entries: 2, Overwritten: 1, AverageAccess: uint64(t0.Unix() + 4)}) {
		t.Fatalf("a answered and b stored again at +4 s: %+v", got)
	}
	c.sweep(t0.Add(11 * time.Second)) // a's time is over, b's not
	if got := c.stats(); got != (CacheStats{Entries: 1, Expired: 1, Overwritten: 1, AverageAccess: uint64(t0.Unix() + 4)}) {
		t.Fatalf("after a sweep at +11 s: %+v", got)
	}
}
