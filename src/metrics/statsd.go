package metrics

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"time"
)

// StatsdOptions configures RunStatsd.
type StatsdOptions struct {
	Addr     string        // host:port of the statsd server (UDP)
	Interval time.Duration // flush period; 0 means 10s
	// Tags are appended to every stat name in the gostats form
	// ".__key=value", as envoyproxy/ratelimit's EXTRA_TAGS are.
	Tags map[string]string
}

// RunStatsd sends the per-rule counters (ratelimit.service.rate_limit.
// DOMAIN.KEY.STAT) and the service-level ones (see serviceStats) to statsd
// as counter deltas, named like envoyproxy/ratelimit's, every interval until
// ctx ends (and once more then).
func (r *Registry) RunStatsd(ctx context.Context, o StatsdOptions) error {
	if o.Interval <= 0 {
		o.Interval = 10 * time.Second
	}
	conn, err := net.Dial("udp", o.Addr)
	if err != nil {
		return fmt.Errorf("statsd: %w", err)
	}
	defer conn.Close()
	suffix := tagSuffix(o.Tags)
	sent := map[*Rule][6]uint64{}
	sentService := map[string]uint64{}
	t := time.NewTicker(o.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			r.flushStatsd(conn, sent, sentService, suffix)
			return nil
		case <-t.C:
			r.flushStatsd(conn, sent, sentService, suffix)
		}
	}
}

func tagSuffix(tags map[string]string) string {
	keys := make([]string, 0, len(tags))
	for k := range tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, ".__%s=%s", k, tags[k])
	}
	return b.String()
}

// maxPacket keeps datagrams under a typical MTU.
const maxPacket = 1400

func (r *Registry) flushStatsd(conn net.Conn, sent map[*Rule][6]uint64, sentService map[string]uint64, suffix string) {
	var pkt []byte
	add := func(line string) {
		if len(pkt)+len(line)+1 > maxPacket && len(pkt) > 0 {
			_, _ = conn.Write(pkt) // statsd is best effort by design
			pkt = pkt[:0]
		}
		if len(pkt) > 0 {
			pkt = append(pkt, '\n')
		}
		pkt = append(pkt, line...)
	}
	for _, rule := range r.Rules() {
		now := rule.values()
		prev := sent[rule]
		sent[rule] = now
		for i, v := range now {
			if v != prev[i] {
				add(fmt.Sprintf("%s.%s%s:%d|c", rule.stat, ruleStatNames[i], suffix, v-prev[i]))
			}
		}
	}
	for _, st := range r.serviceStats() {
		v := st.value()
		if prev := sentService[st.name]; v != prev {
			add(fmt.Sprintf("%s%s:%d|c", st.name, suffix, v-prev))
			sentService[st.name] = v
		}
	}
	if len(pkt) > 0 {
		_, _ = conn.Write(pkt)
	}
}

// ruleStatPrefix is a rule's statsd name prefix,
// ratelimit.service.rate_limit.DOMAIN.KEY, with every byte that could end
// or split a statsd line, or a /stats "name: value" line, replaced by "_":
// with detailed_metric or value_to_metric the key holds request values,
// which a client chooses ("x:1|c\nforged:9|c" would otherwise add a
// counter of its own).
func ruleStatPrefix(domain, key string) string {
	return "ratelimit.service.rate_limit." + statSafe(domain) + "." + statSafe(key)
}

// statSafe replaces control bytes, whitespace and the statsd delimiters
// (: | @ # ,) with "_". Other bytes, dots and UTF-8 included, stay.
func statSafe(s string) string {
	unsafe := func(c byte) bool {
		return c <= ' ' || c == 0x7f || c == ':' || c == '|' || c == '@' || c == '#' || c == ','
	}
	i := 0
	for i < len(s) && !unsafe(s[i]) {
		i++
	}
	if i == len(s) {
		return s
	}
	b := []byte(s)
	for ; i < len(b); i++ {
		if unsafe(b[i]) {
			b[i] = '_'
		}
	}
	return string(b)
}
