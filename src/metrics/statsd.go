package metrics

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// StatsdOptions configures RunStatsd.
type StatsdOptions struct {
	// Network is "tcp" (the default, as envoyproxy/ratelimit sends) or
	// "udp".
	Network  string
	Addr     string        // host:port of the statsd server
	Interval time.Duration // counter flush period; 0 means 10s
	// Tags are appended to every stat name in the gostats form
	// ".__key=value", as envoyproxy/ratelimit's EXTRA_TAGS are.
	Tags map[string]string
	// OnError hears about the collector becoming unreachable (once per
	// outage, not per flush) and OnRecover about it answering again.
	OnError   func(error)
	OnRecover func()
}

// timingBuffer bounds the response times waiting to be sent: what arrives
// while it is full is dropped (and counted), so a slow or absent collector
// never holds a request or grows memory.
const timingBuffer = 16384

// timingFlush is how often response times are sent, at most.
const timingFlush = time.Second

// writeTimeout bounds one write to the collector.
const writeTimeout = time.Second

// RunStatsd sends, until ctx ends (and once more then), the per-rule
// counters (ratelimit.service.rate_limit.DOMAIN.KEY.STAT) and the
// service-level ones (see serviceStats) as counter deltas every interval,
// and every ShouldRateLimit's response time as the timer
// ratelimit_server.ShouldRateLimit.response_time (ms) within a second, all
// named like envoyproxy/ratelimit's. Over TCP the connection is dialled
// when needed and redialled after a failure; counts that could not be sent
// are sent with the next flush, nothing is lost while the collector is
// away except response times past the buffer.
func (r *Registry) RunStatsd(ctx context.Context, o StatsdOptions) error {
	if o.Interval <= 0 {
		o.Interval = 10 * time.Second
	}
	if o.Network == "" {
		o.Network = "tcp"
	}
	if o.Network != "tcp" && o.Network != "udp" {
		return fmt.Errorf("statsd: unknown network %q", o.Network)
	}
	r.timings.Store(&timingQueue{c: make(chan time.Duration, timingBuffer)})
	sk := &statsdSink{o: o, suffix: tagSuffix(o.Tags), sent: map[*Rule][ruleStats]uint64{}, sentService: map[string]uint64{}}
	defer sk.close()
	counters := time.NewTicker(o.Interval)
	defer counters.Stop()
	timers := time.NewTicker(timingFlush)
	defer timers.Stop()
	for {
		select {
		case <-ctx.Done():
			sk.flush(r, true)
			return nil
		case <-counters.C:
			sk.flush(r, true)
		case <-timers.C:
			sk.flush(r, false)
		}
	}
}

// timingQueue carries response times from requests to the statsd flusher.
type timingQueue struct {
	c       chan time.Duration
	dropped atomic.Uint64
}

// observe queues d without ever blocking.
func (q *timingQueue) observe(d time.Duration) {
	select {
	case q.c <- d:
	default:
		q.dropped.Add(1)
	}
}

// StatsdDropped is how many response times statsd dropped because its
// buffer was full (a slow or absent collector).
func (r *Registry) StatsdDropped() uint64 {
	if q := r.timings.Load(); q != nil {
		return q.dropped.Load()
	}
	return 0
}

// statsdSink is the flusher's state: the connection, and what the
// collector has been sent so far.
type statsdSink struct {
	o           StatsdOptions
	suffix      string
	conn        net.Conn
	down        bool
	sent        map[*Rule][ruleStats]uint64
	sentService map[string]uint64
}

func (sk *statsdSink) close() {
	if sk.conn != nil {
		_ = sk.conn.Close()
	}
}

// maxPacket keeps UDP datagrams under a typical MTU; over TCP lines are
// written in chunks of this size too.
const maxPacket = 1400

// flush sends the queued response times and, with counters, the counter
// deltas. Deltas are only marked sent once the write succeeded.
func (sk *statsdSink) flush(r *Registry, counters bool) {
	var lines []string
	q := r.timings.Load()
	if q != nil {
	drain:
		for {
			select {
			case d := <-q.c:
				lines = append(lines, fmt.Sprintf("ratelimit_server.ShouldRateLimit.response_time%s:%s|ms", sk.suffix,
					strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', -1, 64)))
			default:
				break drain
			}
		}
	}
	timings := len(lines)
	var commit func()
	if counters {
		var more []string
		more, commit = sk.counterLines(r)
		lines = append(lines, more...)
	}
	if len(lines) == 0 {
		return
	}
	err := sk.write(lines)
	if err != nil && q != nil {
		// Response times are sent once: those of a failed write are lost,
		// and counted as dropped (counters go again with the next flush).
		q.dropped.Add(uint64(timings))
	}
	if err != nil && sk.o.Network == "tcp" {
		if !sk.down && sk.o.OnError != nil {
			sk.o.OnError(err)
		}
		sk.down = true
		return // counts go again with the next flush
	}
	if sk.down && sk.o.OnRecover != nil {
		sk.o.OnRecover()
	}
	sk.down = false
	if commit != nil {
		commit()
	}
}

// counterLines returns the changed counters' delta lines and a function
// that marks them sent.
func (sk *statsdSink) counterLines(r *Registry) ([]string, func()) {
	var lines []string
	rules := map[*Rule][ruleStats]uint64{}
	for _, rule := range r.Rules() {
		now := rule.values()
		prev := sk.sent[rule]
		rules[rule] = now
		for i, v := range now {
			if v != prev[i] {
				lines = append(lines, fmt.Sprintf("%s.%s%s:%d|c", rule.stat, ruleStatNames[i], sk.suffix, v-prev[i]))
			}
		}
	}
	service := map[string]uint64{}
	for _, st := range r.serviceStats() {
		v := st.value()
		service[st.name] = v
		if prev := sk.sentService[st.name]; v != prev {
			lines = append(lines, fmt.Sprintf("%s%s:%d|c", st.name, sk.suffix, v-prev))
		}
	}
	for _, g := range r.gaugeStats() {
		lines = append(lines, fmt.Sprintf("%s%s:%d|g", g.name, sk.suffix, g.value()))
	}
	return lines, func() {
		for k, v := range rules {
			sk.sent[k] = v
		}
		for k, v := range service {
			sk.sentService[k] = v
		}
	}
}

// write sends lines in packets of at most maxPacket bytes, dialling first
// if needed. Over UDP a lost packet is not an error (statsd over UDP is
// best effort); over TCP any failure closes the connection, to be redialled
// next time.
func (sk *statsdSink) write(lines []string) error {
	if sk.conn == nil {
		c, err := net.DialTimeout(sk.o.Network, sk.o.Addr, writeTimeout)
		if err != nil {
			return fmt.Errorf("statsd: %w", err)
		}
		sk.conn = c
	}
	var pkt []byte
	send := func() error {
		if len(pkt) == 0 {
			return nil
		}
		if sk.o.Network == "tcp" {
			pkt = append(pkt, '\n')
		}
		_ = sk.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
		_, err := sk.conn.Write(pkt)
		pkt = pkt[:0]
		if err != nil && sk.o.Network == "tcp" {
			_ = sk.conn.Close()
			sk.conn = nil
			return fmt.Errorf("statsd: %w", err)
		}
		return nil
	}
	for _, line := range lines {
		if len(pkt)+len(line)+1 > maxPacket {
			if err := send(); err != nil {
				return err
			}
		}
		if len(pkt) > 0 {
			pkt = append(pkt, '\n')
		}
		pkt = append(pkt, line...)
	}
	return send()
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

// ruleStatPrefix is a rule's statsd name prefix,
// ratelimit.service.rate_limit.DOMAIN.KEY, with every byte that could end
// or split a statsd line, or a /stats "name: value" line, replaced by "_":
// with detailed_metric or value_to_metric the key holds request values,
// which a client chooses ("x:1|c\nforged:9|c" would otherwise add a
// counter of its own).
func ruleStatPrefix(domain, key string) string {
	return "ratelimit.service.rate_limit." + ipv4Dots(statSafe(domain)) + "." + ipv4Dots(statSafe(key))
}

// ipv4Pattern is what envoyproxy/ratelimit takes for an IPv4 address in a
// stat name (unanchored, as there).
var ipv4Pattern = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// ipv4Dots writes the dots of every IPv4 address in s as "_", as the
// reference does (remote_address_10_1_2_3), so that a value's dots do not
// add levels to the name and the series keep the reference's names.
func ipv4Dots(s string) string {
	if strings.Count(s, ".") < 3 {
		return s
	}
	return ipv4Pattern.ReplaceAllStringFunc(s, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
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
