package limiter

import (
	"context"
	"errors"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Design of the memory store
//
// Keys are spread over memShards shards by a seeded hash; each shard is a map
// guarded by its own mutex, so unrelated keys rarely contend. A batch locks
// every shard it touches, in ascending shard order (a 64-bit mask makes the
// order free), evaluates all hits against a private overlay, and only then
// writes: this makes a batch atomic, which AllOrNothing needs, and makes a
// limit exact under any number of goroutines.
//
// Memory: each shard holds at most MaxKeys/memShards entries and
// MaxBytes/memShards bytes, counted as entrySize does (a sliding log's
// entries included). A live counter is never dropped to make room: that
// would give its client its budget back, and a client minting new values
// could aim it at anyone's counter. Before a batch writes, the room its new
// counters need is made by dropping expired entries only (an expired entry
// is the same as none): one from a small random sample, or else all of them
// in one pass, which also notes when the shard's next entry expires, so that
// a shard full of live counters answers at once until then. If there is
// still no room, the batch counts nothing: if a hit that is not advisory
// was rejected anyway, Apply answers the batch as decided (the request is
// refused by the counters it has, so a client at its limit cannot pass by
// adding a new value); else it returns ErrFull (the service answers it by
// failure policy), and such refusals are counted. A sweeper
// goroutine drops expired entries every SweepInterval; lookups treat expired
// entries as absent regardless, so the sweeper only frees memory.

const (
	memShards   = 64
	evictSample = 8
)

// The embedded store's bounds unless MemoryOptions says otherwise
// (MEMORY_MAX_KEYS, MEMORY_MAX_BYTES).
const (
	DefaultMaxKeys  = 1 << 20
	DefaultMaxBytes = 256 << 20
)

// MemoryOptions configures a MemoryStore. The zero value is usable.
type MemoryOptions struct {
	// MaxKeys bounds the number of live counters; 0 means 1,048,576.
	MaxKeys int
	// MaxBytes bounds the bytes they hold, as entrySize counts them (a
	// counter about 115 bytes plus its key; a sliding log 16 more per
	// counted call); 0 means 256 MiB.
	MaxBytes int64
	// SweepInterval is how often expired counters are freed; 0 means 10s, a
	// negative value disables the sweeper (tests call Sweep directly).
	SweepInterval time.Duration
	// Clock is used when a Batch has no Now, and by the sweeper; nil means
	// time.Now.
	Clock func() time.Time
}

// MemoryStore is the embedded Store: exact, per process, bounded in memory.
// It is safe for concurrent use. Create it with NewMemoryStore and stop its
// sweeper with Close.
type MemoryStore struct {
	shards   [memShards]memShard
	seed     maphash.Seed
	perShard int
	bytesPer int64 // per shard
	clock    func() time.Time
	refused  atomic.Uint64
	stop     chan struct{}
	done     chan struct{}
}

type memShard struct {
	mu    sync.Mutex
	m     map[string]memEntry
	bytes int64 // entrySize summed over m
	// liveUntil (µs): no entry expires before it, so a full shard has
	// nothing to drop until then (see dropExpired).
	liveUntil int64
	_         [24]byte // keep neighbouring shards' mutexes off one cache line
}

// ErrFull is what Apply returns when a batch needs room for a counter and
// the store has none: every counter it holds still counts hits in its
// window (MEMORY_MAX_KEYS, MEMORY_MAX_BYTES), and none of the batch's hits
// was rejected (then the batch is answered as decided). Nothing of the
// batch is counted.
var ErrFull = errors.New("embedded store full: every counter it holds is live (MEMORY_MAX_KEYS, MEMORY_MAX_BYTES)")

type memEntry struct {
	st      state
	expires int64 // µs
}

// NewMemoryStore returns a MemoryStore and starts its sweeper.
func NewMemoryStore(opts MemoryOptions) *MemoryStore {
	if opts.MaxKeys <= 0 {
		opts.MaxKeys = DefaultMaxKeys
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.SweepInterval == 0 {
		opts.SweepInterval = 10 * time.Second
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	s := &MemoryStore{
		seed:     maphash.MakeSeed(),
		perShard: max(1, opts.MaxKeys/memShards),
		bytesPer: max(1, opts.MaxBytes/memShards),
		clock:    opts.Clock,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].m = make(map[string]memEntry)
	}
	if opts.SweepInterval > 0 {
		go s.sweepLoop(opts.SweepInterval)
	} else {
		close(s.done)
	}
	return s
}

// Close stops the sweeper. The store stays usable.
func (s *MemoryStore) Close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

func (s *MemoryStore) sweepLoop(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sweep(s.clock())
		}
	}
}

// sweep frees every counter expired at now and returns how many it freed.
func (s *MemoryStore) sweep(now time.Time) int {
	us := now.UnixMicro()
	freed := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		freed += sh.dropAllExpired(us)
		sh.mu.Unlock()
	}
	return freed
}

// dropAllExpired frees every entry expired at now, notes when the next one
// expires, and returns how many it freed.
func (sh *memShard) dropAllExpired(now int64) int {
	freed := 0
	next := int64(math.MaxInt64)
	for k, e := range sh.m {
		if e.expires <= now {
			sh.bytes -= entrySize(k, e)
			delete(sh.m, k)
			freed++
		} else {
			next = min(next, e.expires)
		}
	}
	sh.liveUntil = next
	return freed
}

// Refused returns how many batches were refused with ErrFull.
func (s *MemoryStore) Refused() uint64 { return s.refused.Load() }

// pending is one hit's evaluation before it is written.
type pending struct {
	shard   uint8
	st      state
	expires int64
	write   bool
}

// Apply implements Store. It never returns an error.
func (s *MemoryStore) Apply(_ context.Context, b Batch) ([]Outcome, error) {
	now := b.Now
	if now.IsZero() {
		now = s.clock()
	}
	us := now.UnixMicro()
	outs := make([]Outcome, len(b.Hits))
	var buf [8]pending
	pend := buf[:0]
	var mask uint64
	for i := range b.Hits {
		sh := uint8(maphash.String(s.seed, b.Hits[i].Key) % memShards)
		pend = append(pend, pending{shard: sh})
		mask |= 1 << sh
	}
	s.lock(mask)
	defer s.unlock(mask)

	s.evaluate(b.Hits, pend, outs, us)
	commit := Decide(b, outs)
	for i := range b.Hits {
		if h := &b.Hits[i]; pend[i].write && !commit.Writes(h, outs[i]) {
			// Not written: report what a cost of 0 sees in the state as it
			// was before the batch, keeping the decision itself.
			pend[i].write = false
			outs[i] = unwritten(outs[i], s.stored(pend[i].shard, h.Key, us), us, h.Rule)
		}
	}
	if !s.reserve(pend, b.Hits, us) {
		if refusedAnyway(b.Hits, outs) {
			// The request is refused by a counter it has: answer so,
			// counting nothing, rather than let the failure policy (allow,
			// or Envoy's fail-open) admit a client at its limit.
			for i := range b.Hits {
				if pend[i].write {
					outs[i] = unwritten(outs[i], s.stored(pend[i].shard, b.Hits[i].Key, us), us, b.Hits[i].Rule)
				}
			}
			return outs, nil
		}
		s.refused.Add(1)
		return nil, ErrFull
	}
	for i := range b.Hits {
		if pend[i].write {
			s.put(pend[i].shard, b.Hits[i].Key, memEntry{st: pend[i].st, expires: pend[i].expires})
		}
	}
	return outs, nil
}

// refusedAnyway reports whether a hit that is not advisory was rejected:
// the request is refused whatever its other hits get.
func refusedAnyway(hits []Hit, outs []Outcome) bool {
	for i := range hits {
		if !outs[i].Allowed && !hits[i].Advisory {
			return true
		}
	}
	return false
}

// unwritten is the outcome reported for a hit that was evaluated but not
// written: what a cost of 0 sees in the stored state, with the hit's own
// decision (and, if rejected, its retry).
func unwritten(decided Outcome, stored state, now int64, r Rule) Outcome {
	_, out, _, _ := step(stored, now, r, 0, false)
	out.Allowed = decided.Allowed
	out.RetryAfter = decided.RetryAfter
	return out
}

func (s *MemoryStore) stored(sh uint8, key string, now int64) state {
	e, ok := s.shards[sh].m[key]
	if !ok || e.expires <= now {
		return state{}
	}
	return e.st
}

func (s *MemoryStore) put(sh uint8, key string, e memEntry) {
	shard := &s.shards[sh]
	if old, ok := shard.m[key]; ok {
		shard.bytes -= entrySize(key, old)
	}
	shard.m[key] = e
	shard.bytes += entrySize(key, e)
	shard.liveUntil = min(shard.liveUntil, e.expires)
}

// entryOverhead is what a counter costs beside its key and log (the map
// slot, the state, the key's string header), as measured in docs/stores.md.
const entryOverhead = 90

// entrySize is what one counter is counted as against MaxBytes: its key,
// its fixed overhead, and a sliding log's backing array (16 bytes an entry).
func entrySize(key string, e memEntry) int64 {
	n := int64(len(key)) + entryOverhead
	if e.st.log != nil {
		n += 16 * int64(cap(*e.st.log))
	}
	return n
}

// dropExpired frees room in a full shard without losing a live counter: an
// expired entry from a small sample if there is one, else every expired
// entry in one pass, which also notes when the next one expires (liveUntil),
// so that until then a shard full of live counters answers at once. It
// reports whether it freed anything.
func (sh *memShard) dropExpired(now int64) bool {
	if now < sh.liveUntil {
		return false
	}
	n := 0
	for k, e := range sh.m {
		if e.expires <= now {
			sh.bytes -= entrySize(k, e)
			delete(sh.m, k)
			return true
		}
		if n++; n == evictSample {
			break
		}
	}
	return sh.dropAllExpired(now) > 0
}

// Bytes returns the bytes the store's counters are counted as (MaxBytes
// bounds it).
func (s *MemoryStore) Bytes() int64 {
	var n int64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.bytes
		sh.mu.Unlock()
	}
	return n
}

func (s *MemoryStore) lock(mask uint64) {
	for i := 0; mask != 0; i, mask = i+1, mask>>1 {
		if mask&1 != 0 {
			s.shards[i].mu.Lock()
		}
	}
}

func (s *MemoryStore) unlock(mask uint64) {
	for i := 0; mask != 0; i, mask = i+1, mask>>1 {
		if mask&1 != 0 {
			s.shards[i].mu.Unlock()
		}
	}
}
