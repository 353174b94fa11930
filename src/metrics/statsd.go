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
	if o.Network == "" {
		o.Network = "tcp"
	}
	if o.Network != "tcp" && o.Network != "udp" {
		return fmt.Errorf("statsd: unknown network %q", o.Network)
	}
	lines := &statsdLines{o: o, suffix: tagSuffix(o.Tags)}
	defer lines.close()
	r.runFlusher(ctx, o.Interval, lines, o.OnError, o.OnRecover)
	return nil
}

// runFlusher flushes to s every interval (0: 10s), its response times
// every second, and once more when ctx ends.
func (r *Registry) runFlusher(ctx context.Context, interval time.Duration, s sink, onError func(error), onRecover func()) {
	if interval <= 0 {
		interval = 10 * time.Second
	}
	q := &timingQueue{c: make(chan time.Duration, timingBuffer)}
	r.addTimings(q)
	f := newFlusher(s, q, onError, onRecover)
	counters := time.NewTicker(interval)
	defer counters.Stop()
	timers := time.NewTicker(timingFlush)
	defer timers.Stop()
	for {
		select {
		case <-ctx.Done():
			f.flush(r, true)
			return
		case <-counters.C:
			f.flush(r, true)
		case <-timers.C:
			f.flush(r, false)
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

// StatsdDropped is how many response times the collectors (statsd,
// DogStatsD, a Prometheus mapping) dropped because a buffer was full (a
// slow or absent collector).
func (r *Registry) StatsdDropped() uint64 {
	var n uint64
	if qs := r.timings.Load(); qs != nil {
		for _, q := range *qs {
			n += q.dropped.Load()
		}
	}
	return n
}

// sink is where a flush's figures go, in one collector's form: plain
// statsd lines, DogStatsD, or a statsd_exporter mapping. Names are the
// statsd names, with EXTRA_TAGS as the sink carries them.
type sink interface {
	counter(name string, delta uint64)
	gauge(name string, value uint64)
	timer(name string, d time.Duration)
	// send delivers what was added since the last send. An error means
	// nothing of it may have arrived: the counters go again next time.
	send() error
}

// responseTimeStat is the reference's timer of ShouldRateLimit.
const responseTimeStat = "ratelimit_server.ShouldRateLimit.response_time"

// flusher turns the registry's totals into what a sink is sent: counter
// deltas since the last send that arrived, gauges, and the response times
// queued meanwhile.
type flusher struct {
	sink        sink
	timings     *timingQueue
	onError     func(error)
	onRecover   func()
	down        bool
	sent        map[*Rule][ruleStats]uint64
	sentService map[string]uint64
}

func newFlusher(s sink, q *timingQueue, onError func(error), onRecover func()) *flusher {
	return &flusher{sink: s, timings: q, onError: onError, onRecover: onRecover, sent: map[*Rule][ruleStats]uint64{}, sentService: map[string]uint64{}}
}

// flush sends the queued response times and, with counters, the counter
// deltas and gauges. Deltas are only marked sent once the send succeeded.
func (f *flusher) flush(r *Registry, counters bool) {
	timings := 0
	q := f.timings
	if q != nil {
	drain:
		for {
			select {
			case d := <-q.c:
				f.sink.timer(responseTimeStat, d)
				timings++
			default:
				break drain
			}
		}
	}
	var commit func()
	added := timings > 0
	if counters {
		var n int
		n, commit = f.counters(r)
		added = added || n > 0
	}
	if !added {
		return
	}
	err := f.sink.send()
	if err != nil && q != nil {
		// Response times are sent once: those of a failed send are lost,
		// and counted as dropped (counters go again with the next flush).
		q.dropped.Add(uint64(timings))
	}
	if err != nil {
		if !f.down && f.onError != nil {
			f.onError(err)
		}
		f.down = true
		return // counts go again with the next flush
	}
	if f.down && f.onRecover != nil {
		f.onRecover()
	}
	f.down = false
	if commit != nil {
		commit()
	}
}

// counters adds the changed counters' deltas and every gauge to the sink,
// and returns how many it added and a function that marks them sent.
func (f *flusher) counters(r *Registry) (int, func()) {
	n := 0
	rules := map[*Rule][ruleStats]uint64{}
	for _, rule := range r.Rules() {
		now := rule.values()
		prev := f.sent[rule]
		rules[rule] = now
		for i, v := range now {
			if v != prev[i] {
				f.sink.counter(rule.stat+"."+ruleStatNames[i], v-prev[i])
				n++
			}
		}
	}
	service := map[string]uint64{}
	for _, st := range r.serviceStats() {
		v := st.value()
		service[st.name] = v
		if prev := f.sentService[st.name]; v != prev {
			f.sink.counter(st.name, v-prev)
			n++
		}
	}
	for _, g := range r.gaugeStats() {
		f.sink.gauge(g.name, g.value())
		n++
	}
	return n, func() {
		for k, v := range rules {
			f.sent[k] = v
		}
		for k, v := range service {
			f.sentService[k] = v
		}
	}
}

// statsdLines is the plain statsd sink: "NAME.__k=v:VALUE|TYPE" lines, as
// envoyproxy/ratelimit's stats library writes them, over TCP or UDP.
type statsdLines struct {
	o      StatsdOptions
	suffix string
	conn   net.Conn
	lines  []string
}

func (sl *statsdLines) counter(name string, delta uint64) {
	sl.lines = append(sl.lines, fmt.Sprintf("%s%s:%d|c", name, sl.suffix, delta))
}

func (sl *statsdLines) gauge(name string, value uint64) {
	sl.lines = append(sl.lines, fmt.Sprintf("%s%s:%d|g", name, sl.suffix, value))
}

func (sl *statsdLines) timer(name string, d time.Duration) {
	sl.lines = append(sl.lines, fmt.Sprintf("%s%s:%s|ms", name, sl.suffix,
		strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', -1, 64)))
}

func (sl *statsdLines) close() {
	if sl.conn != nil {
		_ = sl.conn.Close()
	}
}

// maxPacket keeps UDP datagrams under a typical MTU; over TCP lines are
// written in chunks of this size too.
const maxPacket = 1400

// send writes the lines in packets of at most maxPacket bytes, dialling
// first if needed. Over UDP a lost packet is not an error (statsd over UDP
// is best effort); over TCP any failure closes the connection, to be
// redialled next time.
func (sl *statsdLines) send() error {
	lines := sl.lines
	sl.lines = sl.lines[:0]
	if sl.conn == nil {
		c, err := net.DialTimeout(sl.o.Network, sl.o.Addr, writeTimeout)
		if err != nil {
			return fmt.Errorf("statsd: %w", err)
		}
		sl.conn = c
	}
	var pkt []byte
	send := func() error {
		if len(pkt) == 0 {
			return nil
		}
		if sl.o.Network == "tcp" {
			pkt = append(pkt, '\n')
		}
		_ = sl.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
		_, err := sl.conn.Write(pkt)
		pkt = pkt[:0]
		if err != nil && sl.o.Network == "tcp" {
			_ = sl.conn.Close()
			sl.conn = nil
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
