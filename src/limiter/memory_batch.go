package limiter

// How the embedded store decides a batch and makes room for its writes:
// evaluate, current, reserve (used by MemoryStore.Apply, memory.go).

// evaluate decides every hit of a batch in order, each on the state the
// batch's earlier writes to its key left (pend), filling outs. A large
// batch (an RLQS round's) finds a key's earlier write in a map: searched,
// a batch of n distinct keys costs n² comparisons, with every shard it
// touches locked. The caller holds the batch's shards.
func (s *MemoryStore) evaluate(hits []Hit, pend []pending, outs []Outcome, us int64) {
	var last map[string]int
	if len(hits) > largeBatch {
		last = make(map[string]int, len(hits))
	}
	for i := range hits {
		h := &hits[i]
		var prior state
		if j, ok := last[h.Key]; ok {
			prior = pend[j].st
		} else if last != nil {
			prior = s.stored(pend[i].shard, h.Key, us)
		} else {
			prior = s.current(pend[:i], hits[:i], pend[i].shard, h.Key, us)
		}
		st, out, exp, write := step(prior, us, h.Rule, h.Cost, h.Refund)
		outs[i] = out
		pend[i].st, pend[i].expires, pend[i].write = st, exp, write
		if write && last != nil {
			last[h.Key] = i
		}
	}
}

// current returns the state a hit sees: the latest pending write to the same
// key earlier in the batch, else the stored state.
func (s *MemoryStore) current(prev []pending, hits []Hit, sh uint8, key string, now int64) state {
	for j := len(prev) - 1; j >= 0; j-- {
		// A rejected earlier hit on the same key wrote nothing: skip it.
		if prev[j].write && hits[j].Key == key {
			return prev[j].st
		}
	}
	return s.stored(sh, key, now)
}

// reserve makes the room the batch's writes need in each shard, dropping
// expired entries only, and reports whether there is enough. It runs with
// the batch's shards locked, before anything is written.
func (s *MemoryStore) reserve(pend []pending, hits []Hit, now int64) bool {
	type need struct {
		shard uint8
		keys  int
		bytes int64
	}
	var buf [8]need
	needs := buf[:0]
	var last map[string]int // each key's last write, in a large batch
	if len(hits) > largeBatch {
		last = make(map[string]int, len(hits))
		for i := range hits {
			if pend[i].write {
				last[hits[i].Key] = i
			}
		}
	}
	for i := range hits {
		if !pend[i].write {
			continue
		}
		if last != nil && last[hits[i].Key] != i || last == nil && laterWrite(pend[i+1:], hits[i+1:], hits[i].Key) {
			continue // only the last write to a key stays
		}
		sh := &s.shards[pend[i].shard]
		n := need{shard: pend[i].shard, bytes: entrySize(hits[i].Key, memEntry{st: pend[i].st})}
		if old, ok := sh.m[hits[i].Key]; ok && old.expires > now {
			n.bytes -= entrySize(hits[i].Key, old)
		} else {
			n.keys = 1 // new, or replacing an expired entry that room-making may drop first
		}
		j := 0
		for j < len(needs) && needs[j].shard != n.shard {
			j++
		}
		if j == len(needs) {
			needs = append(needs, need{shard: n.shard})
		}
		needs[j].keys += n.keys
		needs[j].bytes += n.bytes
	}
	for _, n := range needs {
		sh := &s.shards[n.shard]
		for len(sh.m)+n.keys > s.perShard || sh.bytes+n.bytes > s.bytesPer {
			if !sh.dropExpired(now) {
				return false
			}
		}
	}
	return true
}

// largeBatch is the batch size past which Apply finds a key's other
// writes in the batch through a map rather than by searching.
const largeBatch = 32

// laterWrite reports whether one of the pending writes writes key.
func laterWrite(pend []pending, hits []Hit, key string) bool {
	for i := range hits {
		if pend[i].write && hits[i].Key == key {
			return true
		}
	}
	return false
}
