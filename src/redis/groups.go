package redis

import (
	"strings"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

// Groups: a batch's hits split into script calls, one per Cluster slot
// (hash tag) or, on one node, one in all, and the calls' answers put back
// in the batch's order.

// group is the hits that go into one script call.
type group struct {
	idx  []int // positions in the batch
	keys []string
	hits []*limiter.Hit
	// wants and grants, when not nil, hold each hit's lease parameter
	// (the slice it asks for; see batch.lua) and the slice its answer
	// granted.
	wants  []uint64
	grants []grant
}

// collectGrants gathers the slices the groups' answers granted, by hit;
// nil when no hit asked for one.
func collectGrants(groups []*group, n int) []grant {
	var grants []grant
	for _, g := range groups {
		if g.grants == nil {
			continue
		}
		if grants == nil {
			grants = make([]grant, n)
		}
		for j, i := range g.idx {
			grants[i] = g.grants[j]
		}
	}
	return grants
}

// groups answers what the local cache knows and groups the rest: one group
// per hash tag in Cluster mode, else one group. cachedReject reports a
// cached rejection of a blocking hit under AllOrNothing: the request is
// rejected anyway, and the call is to be a dry run.
func (s *Store) groups(b limiter.Batch, outs []limiter.Outcome, now time.Time, wants []uint64) (gs []*group, cachedReject bool) {
	if !s.cluster && s.cache == nil && wants == nil {
		// The common case: one group of every hit, built without a map.
		g := &group{idx: make([]int, len(b.Hits)), keys: make([]string, len(b.Hits)), hits: make([]*limiter.Hit, len(b.Hits))}
		for i := range b.Hits {
			g.idx[i], g.keys[i], g.hits[i] = i, s.prefix+tagged(b.Hits[i].Key), &b.Hits[i]
		}
		if len(b.Hits) == 0 {
			return nil, false
		}
		return []*group{g}, false
	}
	byTag := map[string]*group{}
	for i := range b.Hits {
		h := &b.Hits[i]
		if s.cache != nil {
			out, ok := s.cache.get(h, now)
			if !ok {
				s.cacheMisses.Add(1)
			} else {
				outs[i] = out
				s.cacheHits.Add(1)
				if b.AllOrNothing && !h.Advisory {
					cachedReject = true
				}
				continue
			}
		}
		tag := ""
		if s.cluster {
			tag = hashTag(h.Key)
		}
		g := byTag[tag]
		if g == nil {
			g = &group{}
			byTag[tag] = g
			gs = append(gs, g)
		}
		g.idx = append(g.idx, i)
		g.keys = append(g.keys, s.prefix+tagged(h.Key))
		g.hits = append(g.hits, h)
		if wants != nil {
			g.wants = append(g.wants, wants[i])
		}
	}
	for _, g := range gs {
		if g.wants != nil {
			g.grants = make([]grant, len(g.hits))
		}
	}
	return gs, cachedReject
}

// tagged is key with a hash tag: itself, as every key the service makes
// carries one, or else key in braces. A fixed window's count and a key's
// held hits live in keys named after it (batch.lua's win_key and
// held_key), which Redis Cluster must find in its slot.
func tagged(key string) string {
	if hashTag(key) != key {
		return key
	}
	return "{" + key + "}"
}

// hashTag is key's Redis Cluster hash tag, or key itself when it has none.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// reportGroups keeps only the hits of groups that a rejection does not
// cancel (limiter.Hit.Reports), given their checked outcomes.
func reportGroups(groups []*group, checked []limiter.Outcome) []*group {
	var out []*group
	for _, g := range groups {
		r := &group{}
		for j, h := range g.hits {
			if h.Reports(checked[g.idx[j]]) {
				r.idx, r.keys, r.hits = append(r.idx, g.idx[j]), append(r.keys, g.keys[j]), append(r.hits, h)
			}
		}
		if len(r.hits) > 0 {
			out = append(out, r)
		}
	}
	return out
}
