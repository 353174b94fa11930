package config

import (
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/openrls/ratelimit/src/limiter"
)

// RejectedHits says what a fixed_window limit does with a hit it rejects:
// a descriptor's rejected_hits, or the default for those that do not say
// (REJECTED_HITS, Options.RejectedHits).
// One byte, as the descriptor's other flags: a large config keeps one
// per descriptor.
type RejectedHits uint8

const (
	// RejectedUnset is a descriptor that does not say: the default applies.
	RejectedUnset RejectedHits = iota
	// RejectedCount counts every hit, as envoyproxy/ratelimit does, and
	// rejects a hit once the count after it passes the limit
	// (limiter.Rule.CountRejected). Usage reported after the response
	// (checks with hits_addend 0, then the usage) then holds a tenant back
	// once its reports pass the limit. It is the default, so that the
	// reference's configs admit what they admitted there.
	RejectedCount
	// RejectedDrop is this service's exact counting: a hit that does not fit
	// consumes nothing.
	RejectedDrop
)

// String is the setting's word for r: "count", "drop", or "" when unset.
func (r RejectedHits) String() string {
	switch r {
	case RejectedCount:
		return "count"
	case RejectedDrop:
		return "drop"
	}
	return ""
}

// ParseRejectedHits reads REJECTED_HITS or rejected_hits: "count" or
// "drop".
func ParseRejectedHits(s string) (RejectedHits, error) {
	switch s {
	case "count":
		return RejectedCount, nil
	case "drop":
		return RejectedDrop, nil
	}
	return RejectedUnset, fmt.Errorf("want count or drop, got %q", s)
}

// rejectedHits decodes a descriptor's rejected_hits and checks it against
// the descriptor's limits: count applies only to fixed windows, and
// neither to overdraft (which counts rejected hits already, and rejects a
// check at exactly the limit) nor to lease (a slice is spent where the
// count cannot see it).
func (d *decoder) rejectedHits(desc *Descriptor, n *yaml.Node, path string) {
	if n == nil || isNull(n) {
		return
	}
	path += ".rejected_hits"
	r, err := ParseRejectedHits(d.str(n, path, ""))
	if err != nil {
		d.errf(n, path, "%v", err)
		return
	}
	desc.RejectedHits = r
	if r != RejectedCount {
		return
	}
	if desc.Overdraft {
		d.errf(n, path, "rejected_hits: count cannot be combined with overdraft: both count hits past the limit; "+
			"overdraft also rejects a check (hits_addend 0) at exactly the limit, count lets it pass")
	}
	counted := false
	for _, l := range desc.Limits {
		switch {
		case l.Unlimited:
			continue
		case l.Algorithm != limiter.FixedWindow:
			d.errf(n, path, "rejected_hits: count applies to fixed_window limits only, and the limit at line %d is %s "+
				"(overdraft: true counts usage past the limit on every algorithm)", l.Line, l.Algorithm)
		case l.Lease:
			d.errf(n, path, "rejected_hits: count cannot be combined with lease (the limit at line %d): "+
				"a slice is spent on a replica, where a count past the limit cannot be seen", l.Line)
		}
		counted = true
	}
	if !counted {
		d.errf(n, path, "rejected_hits applies to this descriptor's own limits, and it has none (it is not inherited)")
	}
}

// countsRejected reports whether l counts the hits it rejects
// (Rule.CountRejected) under a descriptor that says r and a default of
// def: a fixed window without overdraft or lease, unless its descriptor or
// the default says drop. A limit of 0 rejects everything, checks included,
// and never counts: counting would only keep a counter per value denied,
// which a flood of distinct values would grow without bound.
func countsRejected(l *Limit, r, def RejectedHits) bool {
	if r == RejectedUnset {
		r = def
	}
	return r != RejectedDrop && l.Algorithm == limiter.FixedWindow && l.RequestsPerUnit > 0 &&
		!l.Unlimited && !l.Lease && !l.Rule.Overdraft
}
