package limiter

import "time"

// What tests look at, not part of the API.

// Open reports whether the breaker is short-circuiting.
func (b *Breaker) Open() bool { return b.open.Load() }

// Sweep frees every counter expired at now and returns how many it freed.
func (s *MemoryStore) Sweep(now time.Time) int { return s.sweep(now) }

// Len returns the number of counters held, expired or not.
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}
