package config

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/openrls/ratelimit/src/limiter"
)

// Plan is what one request asks of the store: the hits to apply and, for each
// request descriptor, what matched. Plans are pooled: call Release when done
// with one, and keep nothing from it but the Hits' key strings.
type Plan struct {
	Domain *Domain // nil when the domain is unknown: everything is OK
	Descs  []DescPlan
	Hits   []limiter.Hit
	Refs   []Ref // parallel to Hits

	keyBuf  []byte // descriptor parts of the keys, back to back
	scratch []byte // one key at a time
	limits  []*Limit
}

// DescPlan is the plan for one request descriptor, in request order.
type DescPlan struct {
	Node      *Node // the matched descriptor; nil when nothing matched
	Unlimited bool
	// MetricKey, when not empty, names this descriptor's rules in metrics
	// instead of each Limit's MetricKey: it holds request values, because
	// the rule asked for them (detailed_metric, value_to_metric), or
	// because the request overrode the limit (override), which the
	// reference names by the descriptor's entries.
	MetricKey string
	override  bool
	// Hits[First:First+Count] are this descriptor's hits.
	First, Count int

	limits           []*Limit // matched, before replaces
	keyStart, keyEnd int      // this descriptor's key part in keyBuf
}

// Ref ties a hit back to its descriptor and limit.
type Ref struct {
	Desc  int
	Limit *Limit
}

var planPool = sync.Pool{New: func() any { return &Plan{} }}

// Release returns the plan to the pool. The plan must not be used after.
func (p *Plan) Release() {
	clear(p.Hits) // drop key strings and rules for the collector
	clear(p.Refs)
	clear(p.limits)
	*p = Plan{Descs: p.Descs[:0], Hits: p.Hits[:0], Refs: p.Refs[:0], keyBuf: p.keyBuf[:0], scratch: p.scratch[:0], limits: p.limits[:0]}
	planPool.Put(p)
}

// Plan matches every request descriptor and builds the hits. hitsAddend is
// the request's; a descriptor's own hits_addend wins when set.
func (c *Config) Plan(domain string, descs []*rlv3.RateLimitDescriptor, hitsAddend uint32) (*Plan, error) {
	p := planPool.Get().(*Plan)
	p.Domain = c.Domain(domain)
	p.Descs = grow(p.Descs, len(descs))
	if p.Domain == nil {
		return p, nil
	}
	var replaced map[string]bool
	for i, desc := range descs {
		dp := &p.Descs[i]
		dp.keyStart = len(p.keyBuf)
		n := p.Domain.match(desc.GetEntries(), &p.keyBuf)
		dp.keyEnd = len(p.keyBuf)
		dp.Node = n
		switch {
		case desc.GetLimit() != nil:
			dp.MetricKey, dp.override = overrideMetricKey(desc.GetEntries()), true
		case n != nil && (n.detailedMetric || n.valueInPath):
			dp.MetricKey = p.Domain.metricKey(desc.GetEntries(), n.detailedMetric)
		}
		o := desc.GetLimit()
		if len(desc.GetEntries()) == 0 {
			// Nothing to match or to name a counter by: no limit, not even
			// an override, which would share one counter among every such
			// descriptor.
			o = nil
		}
		limits, err := p.limitsFor(n, o)
		if err != nil {
			p.Release()
			return nil, fmt.Errorf("descriptors[%d].limit: %w", i, err)
		}
		dp.limits = limits
		replaced = noteReplaced(replaced, limits)
	}
	p.addHits(descs, hitsAddend, replaced)
	return p, nil
}

// addHits adds each descriptor's hits, one per limit it matched that no
// other descriptor's replaces, in order.
func (p *Plan) addHits(descs []*rlv3.RateLimitDescriptor, hitsAddend uint32, replaced map[string]bool) {
	for i, desc := range descs {
		dp := &p.Descs[i]
		dp.First = len(p.Hits)
		cost := descCost(desc, hitsAddend)
		for _, l := range dp.limits {
			if l.Name != "" && replaced[l.Name] {
				continue
			}
			if l.Unlimited {
				dp.Unlimited = true
				continue
			}
			p.scratch = appendIdentity(append(p.scratch[:0], p.keyBuf[dp.keyStart:dp.keyEnd]...), l)
			p.Hits = append(p.Hits, limiter.Hit{
				Key:      string(p.scratch),
				Rule:     l.Rule,
				Cost:     cost,
				Advisory: dp.Node != nil && (dp.Node.shadowMode || dp.Node.quotaMode),
				Refund:   desc.GetIsNegativeHits(),
			})
			p.Refs = append(p.Refs, Ref{Desc: i, Limit: l})
		}
		dp.Count = len(p.Hits) - dp.First
	}
}

// noteReplaced adds the names limits replace to replaced, made when
// first needed.
func noteReplaced(replaced map[string]bool, limits []*Limit) map[string]bool {
	for _, l := range limits {
		for _, r := range l.Replaces {
			if replaced == nil {
				replaced = map[string]bool{}
			}
			replaced[r] = true
		}
	}
	return replaced
}

// descCost is what each of desc's hits counts: its own hits_addend when
// set, else the request's, else 1.
func descCost(desc *rlv3.RateLimitDescriptor, hitsAddend uint32) uint64 {
	if h := desc.GetHitsAddend(); h != nil {
		return h.GetValue()
	}
	if hitsAddend == 0 {
		return 1
	}
	return uint64(hitsAddend)
}

// grow returns s with length n, zeroed, reusing its array when it can.
func grow(s []DescPlan, n int) []DescPlan {
	if cap(s) < n {
		return make([]DescPlan, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// limitsFor returns the limits of a matched node, or the request's override.
// An override needs a known domain but not a matching descriptor, as in the
// reference implementation; it keeps the matched node's algorithm.
func (p *Plan) limitsFor(n *Node, o *rlv3.RateLimitDescriptor_RateLimitOverride) ([]*Limit, error) {
	if o == nil {
		if n == nil {
			return nil, nil
		}
		return n.limits, nil
	}
	l, err := overrideLimit(o)
	if err != nil {
		return nil, err
	}
	// Metrics name an override by the request's entries (see
	// overrideMetricKey), up to the cap on such series; past it, by this.
	l.MetricKey = "_override"
	if n != nil {
		l.MetricKey = n.path + "._override"
	}
	if n != nil && len(n.limits) > 0 && !n.limits[0].Unlimited {
		l.Algorithm = n.limits[0].Algorithm
		if err := l.finish(); err != nil {
			return nil, err
		}
		l.Rule.Overdraft = n.limits[0].Rule.Overdraft
		l.Rule.CountRejected = n.limits[0].Rule.CountRejected
	} else if p.Domain != nil {
		l.Rule.CountRejected = p.Domain.countRejected
	}
	l.Rule.CountRejected = l.Rule.CountRejected && l.RequestsPerUnit > 0 // as countsRejected
	start := len(p.limits)
	p.limits = append(p.limits, l)
	return p.limits[start : start+1 : start+1], nil
}

// overrideLimit turns a per-request override into a Limit. It is built per
// request and never cached, so overrides leave no state behind beyond the
// store's own expiring counters.
func overrideLimit(o *rlv3.RateLimitDescriptor_RateLimitOverride) (*Limit, error) {
	u, ok := unitFromOverride(o.GetUnit())
	if !ok {
		return nil, fmt.Errorf("unit %v is not a usable unit", o.GetUnit())
	}
	l := &Limit{Unit: u, UnitMultiplier: 1, RequestsPerUnit: o.GetRequestsPerUnit()}
	if m := o.GetUnitMultiplier(); m != nil {
		if m.GetValue() == 0 {
			return nil, fmt.Errorf("unit_multiplier must be at least 1")
		}
		l.UnitMultiplier = m.GetValue()
	}
	if err := l.finish(); err != nil {
		return nil, err
	}
	return l, nil
}

// Window is the limit's period: UnitMultiplier units.
func (l *Limit) Window() time.Duration { return l.Rule.Period }

// metricKey names a matched descriptor by its request values: every level's
// when all is set (detailed_metric), else only the levels that ask
// (value_to_metric); the other levels keep their config path element.
// appendMetricValue appends a request value to a metric name: as itself up
// to MaxRawField bytes, else as '#' and the first 128 bits of its SHA-256 in
// hex, as counter keys do, so that no series name grows with the request.
func appendMetricValue(b []byte, v string) []byte {
	if len(v) <= maxRawField {
		return append(b, v...)
	}
	return appendHash(append(b, '#'), v)
}

// overrideMetricKey names a descriptor that overrides its limit as the
// reference does: every entry's key_value (key alone for an empty value),
// joined by dots.
func overrideMetricKey(entries []*rlv3.RateLimitDescriptor_Entry) string {
	var b []byte
	for i, e := range entries {
		if i > 0 {
			b = append(b, '.')
		}
		b = append(b, e.GetKey()...)
		if e.GetValue() != "" {
			b = append(b, '_')
			b = appendMetricValue(b, e.GetValue())
		}
	}
	return string(b)
}

func (d *Domain) metricKey(entries []*rlv3.RateLimitDescriptor_Entry, all bool) string {
	var b []byte
	lv := &d.root
	for i, e := range entries {
		n := lv.find(e.GetKey(), e.GetValue())
		if i > 0 {
			b = append(b, '.')
		}
		b = append(b, e.GetKey()...)
		switch {
		case n.shareThreshold && n.wildcard != nil:
			// Every value sharing the wildcard's counter shares its name
			// too: the pattern, as the reference names it.
			b = append(b, '_')
			b = append(b, n.value...)
		case all || n.valueToMetric:
			b = append(b, '_')
			b = appendMetricValue(b, e.GetValue())
		case n.value != "":
			b = append(b, '_')
			b = append(b, n.value...)
		}
		lv = &n.children
	}
	return string(b)
}

// What the service needs of a matched descriptor, so that it reads the plan
// and never the config's tree.

// Shadow reports whether the matched rule is in shadow mode.
func (d *DescPlan) Shadow() bool { return d.Node != nil && d.Node.shadowMode }

// Quota reports whether the matched rule is in quota mode.
func (d *DescPlan) Quota() bool { return d.Node != nil && d.Node.quotaMode }

// FailurePolicy is the matched rule's own (or inherited) failure policy;
// empty when it has none or nothing matched.
func (d *DescPlan) FailurePolicy() FailurePolicy {
	if d.Node == nil {
		return ""
	}
	return d.Node.failurePolicy
}

// Metadata is the matched rule's metadata, nil when none.
func (d *DescPlan) Metadata() map[string]any {
	if d.Node == nil {
		return nil
	}
	return d.Node.metadata
}

// Rule is the matched rule's config path, "" when nothing matched.
func (d *DescPlan) Rule() string {
	if d.Node == nil {
		return ""
	}
	return d.Node.path
}

// Source is where the matched rule is written, "file:line" ("" when
// nothing matched).
func (d *DescPlan) Source() string {
	if d.Node == nil {
		return ""
	}
	return d.Node.file + ":" + strconv.Itoa(d.Node.line)
}

// Match says how the last entry matched: "exact", "wildcard", "key_only",
// or "none".
func (d *DescPlan) Match() string {
	switch {
	case d.Node == nil:
		return "none"
	case d.Node.value == "":
		return "key_only"
	case strings.Contains(d.Node.value, "*"):
		return "wildcard"
	}
	return "exact"
}

// MetricKey names hit j's rule in metrics: the limit's own key, or, for a
// rule that asks for request values (detailed_metric, value_to_metric) or
// a limit the request overrode, the key with them, detailed then being
// true.
func (p *Plan) MetricKey(j int) (key string, detailed bool) {
	ref := p.Refs[j]
	d := &p.Descs[ref.Desc]
	if d.MetricKey == "" {
		return ref.Limit.MetricKey, false
	}
	if d.override {
		return d.MetricKey, true
	}
	return d.MetricKey + strings.TrimPrefix(ref.Limit.MetricKey, d.Node.path), true
}
