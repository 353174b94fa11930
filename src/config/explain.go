package config

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/openrls/ratelimit/src/escape"
	"github.com/openrls/ratelimit/src/limiter"
)

// Explain writes, for each request descriptor, how the config decides it,
// without counting anything: at each entry, the rule that matches and why
// (exact value, wildcard, key-only) and the rules that lost (wildcards
// later in the config, or under WILDCARD_PRECEDENCE=most_literal with fewer
// literal characters; a key-only rule beaten by a value); then the rule reached, the
// limits that apply (after replaces across the request) and the counter key
// each would use (before the store's own prefix). The format, one
// descriptor after the other:
//
//	descriptors[0] user=alice,path=/api/x
//	  user=alice: exact value (a.yaml:4)
//	    also matched, lost: wildcard "ali*" (a.yaml:9): an exact value wins
//	  path=/api/x: wildcard "/api/*" (a.yaml:12)
//	  rule: user_alice.path_/api/* (a.yaml:12)
//	  limit: 10 per minute, fixed_window  key {...}:fw60
//
// A limit aligned to a calendar also says, as of now, its window and when
// it next resets:
//
//	calendar: window 2026-12-02 00:00 +14 to 2026-12-03 00:00 +14, next reset in 3h0m0s
//
// A descriptor that matches nothing says at which entry and why.
func (c *Config) Explain(w io.Writer, now time.Time, domain string, descs []*rlv3.RateLimitDescriptor) error {
	d := c.Domain(domain)
	if d == nil {
		_, err := fmt.Fprintf(w, "domain %q: not in the config: every descriptor is answered OK without a limit\n", domain)
		return err
	}
	p, err := c.Plan(domain, descs, 0)
	if err != nil {
		return err
	}
	defer p.Release()
	var b strings.Builder
	for i, desc := range descs {
		var entries []string
		for _, e := range desc.GetEntries() {
			entries = append(entries, e.GetKey()+"="+e.GetValue())
		}
		fmt.Fprintf(&b, "descriptors[%d] %s\n", i, strings.Join(entries, ","))
		n := d.explainWalk(&b, desc.GetEntries())
		dp := &p.Descs[i]
		switch {
		case n == nil:
			b.WriteString("  rule: none: answered OK without a limit\n")
		default:
			fmt.Fprintf(&b, "  rule: %s (%s:%d)\n", n.path, n.file, n.line)
		}
		if dp.Unlimited {
			b.WriteString("  limit: unlimited\n")
		}
		if n != nil && len(n.limits) == 0 && !dp.Unlimited && dp.Count == 0 {
			b.WriteString("  limit: none at this depth (limits apply at the depth of the request's last entry)\n")
		}
		for j := dp.First; j < dp.First+dp.Count; j++ {
			fmt.Fprintf(&b, "  limit: %s  key %s\n", p.Refs[j].Limit, p.Hits[j].Key)
			if cal := p.Refs[j].Limit.Calendar; cal != nil {
				writeCalendar(&b, cal, now)
			}
		}
		switch {
		case dp.Count == 0:
		case dp.Shadow():
			b.WriteString("  shadow_mode: counted, and never rejects: past the limit the answer is still OK (the over-limit stats say it would have been rejected)\n")
		case n != nil && n.quotaMode:
			b.WriteString("  quota_mode: counted; past the limit its status is OVER_LIMIT, and the request is rejected only when every quota-mode descriptor of it is past its limit (or another descriptor rejects)\n")
		}
		if n != nil {
			for _, l := range n.limits {
				if !slices.ContainsFunc(p.Refs[dp.First:dp.First+dp.Count], func(r Ref) bool { return r.Limit == l }) && !l.Unlimited {
					fmt.Fprintf(&b, "  replaced: %s (another descriptor of the request replaces %q)\n", l, l.Name)
				}
			}
		}
	}
	_, err = io.WriteString(w, b.String())
	return err
}

// writeCalendar says which window of cal now is in and when it ends.
func writeCalendar(b *strings.Builder, cal *limiter.Calendar, now time.Time) {
	const layout = "2006-01-02 15:04 MST"
	w := cal.Window(now)
	start, end := cal.Start(w), cal.Start(w+1)
	fmt.Fprintf(b, "  calendar: window %s to %s, next reset in %v\n", start.Format(layout), end.Format(layout), end.Sub(now).Round(time.Second))
}

// explainWalk is match, saying at each entry what matched and what lost.
func (d *Domain) explainWalk(b *strings.Builder, entries []*rlv3.RateLimitDescriptor_Entry) *Node {
	lv := &d.root
	var n *Node
	for depth, e := range entries {
		key, value := e.GetKey(), e.GetValue()
		fmt.Fprintf(b, "  %s=%s: ", key, value)
		exact := lv.exact[key][value]
		var wilds []*Node // the wildcards that match, best first
		if w := lv.wild[key]; w != nil {
			for _, c := range w.all {
				if globMatch(c.wildcard, value) {
					wilds = append(wilds, c)
				}
			}
			slices.SortFunc(wilds, byPrecedence)
		}
		keyOnly := lv.keyOnly[key]
		switch {
		case exact != nil:
			n = exact
			fmt.Fprintf(b, "exact value (%s:%d)\n", n.file, n.line)
		case len(wilds) > 0:
			n = wilds[0]
			fmt.Fprintf(b, "wildcard %q (%s:%d)\n", n.value, n.file, n.line)
		case keyOnly != nil:
			n = keyOnly
			fmt.Fprintf(b, "key only, any value (%s:%d)\n", n.file, n.line)
		default:
			fmt.Fprintf(b, "no rule at depth %d has key %q (or its value): nothing matches\n", depth+1, key)
			return nil
		}
		for _, l := range wilds {
			if l == n {
				continue
			}
			why := "an exact value wins"
			if exact == nil {
				why = fmt.Sprintf("%q has more literal characters (WILDCARD_PRECEDENCE=most_literal)", n.value)
				if l.rank == n.rank {
					why = fmt.Sprintf("%q comes first in the config", n.value)
				}
			}
			fmt.Fprintf(b, "    also matched, lost: wildcard %q (%s:%d): %s\n", l.value, l.file, l.line, why)
		}
		if keyOnly != nil && keyOnly != n {
			fmt.Fprintf(b, "    also matched, lost: key only (%s:%d): a value wins\n", keyOnly.file, keyOnly.line)
		}
		lv = &n.children
	}
	return n
}

// ParseRequest reads a request written as text, a domain and descriptors
// each "key=value[,key=value...]", as config-check -explain and the debug
// port's /explain take it. Its strings are escaped as the service's gRPC
// codec (and POST /json) escape a request's on decoding, so that it
// matches as the same request would there: this is the text form's one
// way in.
func ParseRequest(domain string, descriptors []string) (*rlsv3.RateLimitRequest, error) {
	req := &rlsv3.RateLimitRequest{Domain: domain}
	for _, d := range descriptors {
		desc, err := ParseDescriptor(d)
		if err != nil {
			return nil, err
		}
		req.Descriptors = append(req.Descriptors, desc)
	}
	escape.Request(req)
	return req, nil
}

// ParseDescriptor reads a descriptor written "key=value[,key=value...]",
// as bin/client takes it (and ParseRequest). Keys must not be empty;
// values may be. Nothing is escaped: a client sends the bytes as they
// are, and the service escapes them.
func ParseDescriptor(s string) (*rlv3.RateLimitDescriptor, error) {
	desc := &rlv3.RateLimitDescriptor{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("descriptor entry %q is not key=value", kv)
		}
		desc.Entries = append(desc.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return desc, nil
}
