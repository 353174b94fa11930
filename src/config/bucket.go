package config

import (
	"sort"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// BucketEntries orders an RLQS bucket id, an unordered map, into the
// descriptor entries an RLS client would send for it, so both protocols
// land on one rule and one counter. The walk follows the domain's tree: at
// each level it takes the bucket key that matches a descriptor there (an
// exact value before a wildcard before a key-only descriptor, as RLS
// matching does); when several keys match at one level, the descriptor
// that comes first in the config wins, so the order never depends on the
// map's. Keys the walk cannot place follow, sorted by name, which makes
// the descriptor longer than any rule and so unmatched, as an RLS
// descriptor with an entry past a leaf is.
func (d *Domain) BucketEntries(bucket map[string]string) []*rlv3.RateLimitDescriptor_Entry {
	entries := make([]*rlv3.RateLimitDescriptor_Entry, 0, len(bucket))
	used := make(map[string]bool, len(bucket))
	lv := &d.root
	for lv != nil && len(used) < len(bucket) {
		var best *Node
		var bestKey string
		for k, v := range bucket {
			if used[k] {
				continue
			}
			if n := lv.find(k, v); n != nil && (best == nil || before(n, best)) {
				best, bestKey = n, k
			}
		}
		if best == nil {
			break
		}
		used[bestKey] = true
		entries = append(entries, &rlv3.RateLimitDescriptor_Entry{Key: bestKey, Value: bucket[bestKey]})
		lv = &best.children
	}
	rest := make([]string, 0, len(bucket)-len(used))
	for k := range bucket {
		if !used[k] {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	for _, k := range rest {
		entries = append(entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: bucket[k]})
	}
	return entries
}

// before reports whether a comes before b in the config: by file, then line.
func before(a, b *Node) bool {
	if a.file != b.file {
		return a.file < b.file
	}
	return a.line < b.line
}

// PlanBucket plans one request of an RLQS bucket: the bucket's entries,
// ordered by BucketEntries, as one descriptor of cost 1.
func (c *Config) PlanBucket(domain string, bucket map[string]string) (*Plan, error) {
	var entries []*rlv3.RateLimitDescriptor_Entry
	if d := c.Domain(domain); d != nil {
		entries = d.BucketEntries(bucket)
	}
	return c.Plan(domain, []*rlv3.RateLimitDescriptor{{Entries: entries}}, 1)
}
