// Package topk finds the heaviest items of a stream in bounded memory:
// Space-Saving (Metwally, Agrawal, El Abbadi, 2005) over a sliding pair of
// windows, so that what it reports is what was heavy in the last one to
// two windows, not since the process started.
//
// Space-Saving keeps at most Size counters. An item already counted adds to
// its counter; a new one takes a free counter or, when none is free, the
// smallest, inheriting its count as its error. Any item whose true count
// exceeds the stream's total over Size is guaranteed to be kept, and a kept
// item's count overestimates its true count by at most its error. Memory is
// Size counters per window whatever the stream holds. The counters are
// spread over shards by key (see shards), so the guarantee holds per shard:
// an item above its shard's total over Size/shards is kept.
package topk

import (
	"container/heap"
	"hash/maphash"
	"sort"
	"sync"
	"time"
)

// shards spread the counters over several locks: every request answered
// OVER_LIMIT adds to the sketch, and one lock would serialize them. A key
// always lands in the same shard, so each shard is a Space-Saving summary
// of its share of the stream.
const shards = 8

// Item is one reported item.
type Item struct {
	Key   string
	Count uint64 // an upper bound of its true count in the windows reported
	Error uint64 // Count minus Error is a lower bound
}

// Sketch is safe for concurrent use.
type Sketch struct {
	seed   maphash.Seed
	shards [shards]shard
}

// shard is one lock's windows.
type shard struct {
	size   int
	window time.Duration
	now    func() time.Time

	mu       sync.Mutex
	cur      *summary
	prev     *summary
	curStart time.Time
	_        [40]byte // keep neighbouring shards' locks off one cache line
}

// New returns a sketch of size counters per window (spread over its
// shards); now nil means time.Now.
func New(size int, window time.Duration, now func() time.Time) *Sketch {
	if now == nil {
		now = time.Now
	}
	s := &Sketch{seed: maphash.MakeSeed()}
	per := max(1, size/shards)
	for i := range s.shards {
		sh := &s.shards[i]
		sh.size, sh.window, sh.now = per, window, now
		sh.cur, sh.prev, sh.curStart = newSummary(per), newSummary(0), now()
	}
	return s
}

// Add counts n of key.
func (s *Sketch) Add(key string, n uint64) {
	sh := &s.shards[maphash.String(s.seed, key)%shards]
	sh.mu.Lock()
	sh.rotate()
	sh.cur.add(key, n)
	sh.mu.Unlock()
}

// rotate starts a new window when the current one is over; a gap of two
// windows or more forgets both.
func (sh *shard) rotate() {
	now := sh.now()
	switch elapsed := now.Sub(sh.curStart); {
	case elapsed < sh.window:
		return
	case elapsed < 2*sh.window:
		sh.prev, sh.cur = sh.cur, newSummary(sh.size)
	default:
		sh.prev, sh.cur = newSummary(0), newSummary(sh.size)
	}
	sh.curStart = now
}

// Top returns the n heaviest items of the current and previous windows,
// heaviest first (ties by key).
func (s *Sketch) Top(n int) []Item {
	merged := map[string]Item{}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.rotate()
		for _, sum := range []*summary{sh.prev, sh.cur} {
			for _, c := range sum.heap {
				it := merged[c.key]
				it.Key, it.Count, it.Error = c.key, it.Count+c.count, it.Error+c.err
				merged[c.key] = it
			}
		}
		sh.mu.Unlock()
	}
	out := make([]Item, 0, len(merged))
	for _, it := range merged {
		out = append(out, it)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Key < out[j].Key
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// summary is one window's counters: a min-heap by count, indexed by key.
type summary struct {
	size  int
	index map[string]*counter
	heap  counterHeap
}

type counter struct {
	key        string
	count, err uint64
	pos        int
}

func newSummary(size int) *summary {
	return &summary{size: size, index: make(map[string]*counter, size)}
}

func (s *summary) add(key string, n uint64) {
	if c, ok := s.index[key]; ok {
		c.count += n
		heap.Fix(&s.heap, c.pos)
		return
	}
	if len(s.heap) < s.size {
		c := &counter{key: key, count: n}
		s.index[key] = c
		heap.Push(&s.heap, c)
		return
	}
	// Take over the smallest counter.
	c := s.heap[0]
	delete(s.index, c.key)
	c.key, c.err, c.count = key, c.count, c.count+n
	s.index[key] = c
	heap.Fix(&s.heap, 0)
}

type counterHeap []*counter

func (h counterHeap) Len() int           { return len(h) }
func (h counterHeap) Less(i, j int) bool { return h[i].count < h[j].count }
func (h counterHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].pos, h[j].pos = i, j
}
func (h *counterHeap) Push(x any) {
	c := x.(*counter)
	c.pos = len(*h)
	*h = append(*h, c)
}
func (h *counterHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}
