package config

import (
	"fmt"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/openrls/ratelimit/src/limiter"
)

// Plan is what one request asks of the store: the hits to apply and, for each
// request descriptor, what matched.
type Plan struct {
	Domain *Domain // nil when the domain is unknown: everything is OK
	Descs  []DescPlan
	Hits   []limiter.Hit
	Refs   []Ref // parallel to Hits
}

// DescPlan is the plan for one request descriptor, in request order.
type DescPlan struct {
	Node      *Node // the matched descriptor; nil when nothing matched
	Unlimited bool
	// MetricKey, when not empty, names this descriptor's rules in metrics
	// instead of each Limit's MetricKey: it holds request values, because
	// the rule asked for them (detailed_metric, value_to_metric).
	MetricKey string
	// Hits[First:First+Count] are this descriptor's hits.
	First, Count int
}

// Ref ties a hit back to its descriptor and limit.
type Ref struct {
	Desc  int
	Limit *Limit
}

// Plan matches every request descriptor and builds the hits. hitsAddend is
// the request's; a descriptor's own hits_addend wins when set.
func (c *Config) Plan(domain string, descs []*rlv3.RateLimitDescriptor, hitsAddend uint32) (*Plan, error) {
	p := &Plan{Domain: c.Domain(domain), Descs: make([]DescPlan, len(descs))}
	if p.Domain == nil {
		return p, nil
	}
	matched := make([][]*Limit, len(descs))
	keys := make([][]byte, len(descs))
	var replaced map[string]bool
	for i, desc := range descs {
		var key []byte
		n := p.Domain.match(desc.GetEntries(), &key)
		p.Descs[i].Node = n
		if n != nil && (n.DetailedMetric || n.valueInPath) {
			p.Descs[i].MetricKey = p.Domain.metricKey(desc.GetEntries(), n.DetailedMetric)
		}
		limits, err := limitsFor(n, desc.GetLimit())
		if err != nil {
			return nil, fmt.Errorf("descriptors[%d].limit: %w", i, err)
		}
		matched[i], keys[i] = limits, key
		for _, l := range limits {
			for _, r := range l.Replaces {
				if replaced == nil {
					replaced = map[string]bool{}
				}
				replaced[r] = true
			}
		}
	}
	for i, desc := range descs {
		dp := &p.Descs[i]
		dp.First = len(p.Hits)
		cost := uint64(hitsAddend)
		if cost == 0 {
			cost = 1
		}
		if h := desc.GetHitsAddend(); h != nil {
			cost = h.GetValue()
		}
		for _, l := range matched[i] {
			if l.Name != "" && replaced[l.Name] {
				continue
			}
			if l.Unlimited {
				dp.Unlimited = true
				continue
			}
			key := appendIdentity(keys[i], l)
			p.Hits = append(p.Hits, limiter.Hit{
				Key:      string(key),
				Rule:     l.Rule,
				Cost:     cost,
				Advisory: dp.Node != nil && (dp.Node.ShadowMode || dp.Node.QuotaMode),
			})
			p.Refs = append(p.Refs, Ref{Desc: i, Limit: l})
		}
		dp.Count = len(p.Hits) - dp.First
	}
	return p, nil
}

// limitsFor returns the limits of a matched node, or the request's override.
// An override needs a known domain but not a matching descriptor, as in the
// reference implementation; it keeps the matched node's algorithm.
func limitsFor(n *Node, o *rlv3.RateLimitDescriptor_RateLimitOverride) ([]*Limit, error) {
	if o == nil {
		if n == nil {
			return nil, nil
		}
		return n.Limits, nil
	}
	l, err := OverrideLimit(o)
	if err != nil {
		return nil, err
	}
	// Metrics never name an override by its request values.
	l.MetricKey = "_override"
	if n != nil {
		l.MetricKey = n.Path + "._override"
	}
	if n != nil && len(n.Limits) > 0 && !n.Limits[0].Unlimited {
		l.Algorithm = n.Limits[0].Algorithm
		if err := l.finish(); err != nil {
			return nil, err
		}
	}
	return []*Limit{l}, nil
}

// OverrideLimit turns a per-request override into a Limit. It is built per
// request and never cached, so overrides leave no state behind beyond the
// store's own expiring counters.
func OverrideLimit(o *rlv3.RateLimitDescriptor_RateLimitOverride) (*Limit, error) {
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
		case all || n.ValueToMetric:
			b = append(b, '_')
			b = append(b, e.GetValue()...)
		case n.Value != "":
			b = append(b, '_')
			b = append(b, n.Value...)
		}
		lv = &n.children
	}
	return string(b)
}
