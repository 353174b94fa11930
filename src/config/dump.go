package config

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/openrls/ratelimit/src/limiter"
)

// WriteDump writes the config to w one line per limit, domains sorted and
// descriptors in file order (the debug port's /rlconfig, config-check
// -dump), as it goes, so that a config of 100,000 rules is never built as
// one string.
func (c *Config) WriteDump(w io.Writer) error {
	bw := bufio.NewWriter(w)
	for _, name := range c.Domains() {
		c.domains[name].root.dump(bw, name, true)
	}
	return bw.Flush()
}

// Version names the config by its rules: the first 64 bits of the SHA-256
// of its dump without file positions, in hex. Two configs with the same
// rules (whatever their comments, key order, lines or source, files or
// xDS) share it; any change to a rule changes it. Computed once.
func (c *Config) Version() string {
	c.versionOnce.Do(func() {
		h := sha256.New()
		bw := bufio.NewWriter(h)
		for _, name := range c.Domains() {
			c.domains[name].root.dump(bw, name, false)
		}
		_ = bw.Flush()
		c.version = hex.EncodeToString(h.Sum(nil)[:8])
	})
	return c.version
}

// Summary describes the config in one line per domain: its files, rules
// (descriptors with limits), wildcard rules and limits.
func (c *Config) Summary() string {
	var b strings.Builder
	for _, name := range c.Domains() {
		d := c.domains[name]
		var rules, wild, limits int
		d.visit(func(n *Node) {
			if len(n.limits) > 0 {
				rules++
				limits += len(n.limits)
				if n.wildcard != nil {
					wild++
				}
			}
		})
		fmt.Fprintf(&b, "%s: %s (%d wildcard), %s, from %s\n", name, count(rules, "rule"), wild, count(limits, "limit"), strings.Join(d.Files, ", "))
	}
	return b.String()
}

// dump writes the level's limits, one a line, with their file and line
// when pos is set.
func (lv *level) dump(b *bufio.Writer, domain string, pos bool) {
	for _, n := range lv.nodes() {
		for _, l := range n.limits {
			fmt.Fprintf(b, "%s.%s: %s", domain, n.path, l)
			if n.shadowMode {
				b.WriteString(", shadow_mode")
			}
			if n.quotaMode {
				b.WriteString(", quota_mode")
			}
			if n.shareThreshold {
				b.WriteString(", share_threshold")
			}
			if l.MetricKey != n.path {
				// Several limits on one descriptor: metrics tell them apart.
				fmt.Fprintf(b, ", metrics as %s.%s", domain, l.MetricKey)
			}
			if pos {
				fmt.Fprintf(b, " (%s:%d)", n.file, l.Line)
			}
			b.WriteByte('\n')
		}
		n.children.dump(b, domain, pos)
	}
}

// nodes returns the level's nodes in file order.
func (lv *level) nodes() []*Node {
	var out []*Node
	for _, vs := range lv.exact {
		for _, n := range vs {
			out = append(out, n)
		}
	}
	for _, w := range lv.wild {
		out = append(out, w.all...)
	}
	for _, n := range lv.keyOnly {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].file != out[j].file {
			return out[i].file < out[j].file
		}
		return out[i].line < out[j].line
	})
	return out
}

// String describes the limit, e.g. "10 per 30 seconds, sliding_window".
func (l *Limit) String() string {
	if l.Unlimited {
		return "unlimited" + l.nameString()
	}
	s := fmt.Sprintf("%d per %s, %s", l.RequestsPerUnit, periodString(l.Unit, l.UnitMultiplier), l.Algorithm)
	if l.Algorithm == limiter.Concurrency {
		hold := periodString(l.Unit, l.UnitMultiplier)
		if l.UnitMultiplier <= 1 {
			hold = "1 " + hold
		}
		s = fmt.Sprintf("%d in flight, a slot held at most %s, concurrency", l.RequestsPerUnit, hold)
	}
	if l.Burst > 0 {
		s += fmt.Sprintf(", burst %d", l.Burst)
	}
	if l.Rule.Overdraft {
		s += ", overdraft"
	}
	if l.Lease {
		s += ", lease"
	}
	if l.Calendar != nil {
		s += ", calendar " + l.Calendar.Zone.String()
	}
	return s + l.nameString()
}

func (l *Limit) nameString() string {
	s := ""
	if l.Name != "" {
		s += fmt.Sprintf(", name %q", l.Name)
	}
	if len(l.Replaces) > 0 {
		s += fmt.Sprintf(", replaces %q", l.Replaces)
	}
	return s
}

// count is n things, singular for one.
func count(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
