package config

import (
	"strings"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// match walks the tree along entries and returns the node reached by the
// last entry, or nil when some entry matches nothing. At each level an exact
// value beats a wildcard, which beats a key-only descriptor; the walk never
// backtracks. It also appends the descriptor part of the counter key to key
// when key is not nil.
func (d *Domain) match(entries []*rlv3.RateLimitDescriptor_Entry, key *[]byte) *Node {
	if d == nil || len(entries) == 0 {
		return nil
	}
	if key != nil {
		*key = appendKeyStart(*key, d.Name)
	}
	lv := &d.root
	var n *Node
	for _, e := range entries {
		if lv != nil {
			if n = lv.find(e.GetKey(), e.GetValue()); n != nil {
				lv = &n.children
			} else {
				lv = nil // no match; keep encoding for a per-request override
			}
		}
		if key == nil && lv == nil {
			return nil
		}
		if key != nil {
			*key = appendKeyEntry(*key, n, e.GetKey(), e.GetValue(), d.hashValues)
		}
	}
	if key != nil {
		*key = appendKeyEnd(*key)
	}
	if lv == nil {
		return nil
	}
	return n
}

func (lv *level) find(key, value string) *Node {
	if n := lv.exact[key][value]; n != nil {
		return n
	}
	if w := lv.wild[key]; w != nil {
		if n := w.match(value); n != nil {
			return n
		}
	}
	return lv.keyOnly[key]
}

// globMatch reports whether s matches the pattern split at its stars: parts[0]
// is a prefix, the last part a suffix, and the middle parts occur in order.
func globMatch(parts []string, s string) bool {
	last := len(parts) - 1
	if len(s) < len(parts[0])+len(parts[last]) || !strings.HasPrefix(s, parts[0]) || !strings.HasSuffix(s, parts[last]) {
		return false
	}
	s = s[len(parts[0]) : len(s)-len(parts[last])]
	for _, p := range parts[1:last] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return true
}
