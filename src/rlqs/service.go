package rlqs

import (
	"context"
	"math"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/sirupsen/logrus"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/logthrottle"
	"github.com/openrls/ratelimit/src/rlqs/plan"
)

// Configs yields the config in force.
type Configs interface{ Load() *config.Config }

// Options configure a Service. Zero durations and counts take the
// defaults named beside them.
type Options struct {
	Store   limiter.Store
	Configs Configs
	// Clock is the time reservations are counted at; nil means time.Now.
	// The stores' windows are aligned to it, so replicas need clocks in
	// step (NTP), as Envoys do not.
	Clock func() time.Time
	// Push is how often every stream's token buckets are renewed and its
	// shares refilled (RLQS_PUSH_INTERVAL, 1s).
	Push time.Duration
	// TTL is every assignment's time to live, whole seconds
	// (RLQS_ASSIGNMENT_TTL, 4s). It must exceed Push plus Delivery, so a
	// renewal arrives before the assignment it renews expires.
	TTL time.Duration
	// Delivery bounds how long a sent assignment may take to reach the
	// Envoy, and a report the service (RLQS_DELIVERY_BOUND, 1s): the
	// guarantee assumes it (see lending for the reports).
	Delivery time.Duration
	// Idle is how long a bucket may report no requests before it is
	// abandoned (RLQS_IDLE_ABANDON, 60s).
	Idle time.Duration
	// MaxStreams and MaxBuckets bound the streams served at once and the
	// buckets one stream may hold (RLQS_MAX_STREAMS 10,000,
	// RLQS_MAX_BUCKETS_PER_STREAM 10,000).
	MaxStreams, MaxBuckets int
	// MaxTotalBuckets bounds the buckets of all streams together
	// (DefaultMaxTotalBuckets): the per-stream bound times the stream
	// bound is far more than one process can hold.
	MaxTotalBuckets int
	// MaxIDBytes and MaxTotalIDBytes bound the bytes of bucket ids (keys
	// and values) one stream's buckets and all streams' may hold
	// (RLQS_MAX_BUCKET_ID_BYTES_PER_STREAM 4 MiB, RLQS_MAX_BUCKET_ID_BYTES
	// 32 MiB): a bucket costs memory in proportion to its id as well as
	// its count (docs/settings.md gives the worst case).
	MaxIDBytes, MaxTotalIDBytes int
	Logger                      logrus.FieldLogger
}

// Defaults.
const (
	DefaultPush       = time.Second
	DefaultTTL        = 4 * time.Second
	DefaultDelivery   = time.Second
	DefaultIdle       = time.Minute
	DefaultMaxStreams = 10_000
	DefaultMaxBuckets = 10_000
	// DefaultMaxTotalBuckets keeps a full service's buckets to about
	// 700 MB at their peak (docs/settings.md).
	DefaultMaxTotalBuckets = 50_000

	DefaultMaxIDBytes      = 4 << 20
	DefaultMaxTotalIDBytes = 32 << 20

	// maxEntries, maxField and maxIDBytes bound a bucket id: past them it
	// is refused (not tracked, counted), as an RLS descriptor past its
	// limits is. Envoy's ids are a few short entries.
	maxEntries = 32
	maxField   = 1024
	maxIDBytes = 4096
)

func (o Options) withDefaults() Options {
	if o.Clock == nil {
		o.Clock = time.Now
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&o.Push, DefaultPush}, {&o.TTL, DefaultTTL}, {&o.Delivery, DefaultDelivery}, {&o.Idle, DefaultIdle}} {
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
	o.TTL = o.TTL.Truncate(time.Second) // Envoy 1.40 reads whole seconds only
	if o.MaxStreams <= 0 {
		o.MaxStreams = DefaultMaxStreams
	}
	if o.MaxBuckets <= 0 {
		o.MaxBuckets = DefaultMaxBuckets
	}
	if o.MaxTotalBuckets <= 0 {
		o.MaxTotalBuckets = DefaultMaxTotalBuckets
	}
	if o.MaxIDBytes <= 0 {
		o.MaxIDBytes = DefaultMaxIDBytes
	}
	if o.MaxTotalIDBytes <= 0 {
		o.MaxTotalIDBytes = DefaultMaxTotalIDBytes
	}
	if o.Logger == nil {
		o.Logger = logrus.New()
	}
	return o
}

// Service serves envoy.service.rate_limit_quota.v3.RateLimitQuotaService.
// What it serves from (streams, buckets, pools and ledgers) belongs to
// its owner goroutine (see owner.go); the Service itself holds only what
// every goroutine may read.
type Service struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	o Options

	owner chan<- message
	// stopped is closed when Run ends, and the owner with it.
	stopped chan struct{}
	// due is signalled when a report leaves buckets due a round at once
	// (state.atOnce); Run takes them.
	due chan struct{}

	stats *stats

	storeLog *logthrottle.Throttle
	panicLog *logthrottle.Throttle
}

// New returns a Service and starts its owner; Run drives its rounds, and
// its end stops the service.
func New(o Options) *Service {
	s := &Service{o: o.withDefaults(), stats: newStats(), due: make(chan struct{}, 1), stopped: make(chan struct{}),
		storeLog: &logthrottle.Throttle{Every: logEvery}, panicLog: &logthrottle.Throttle{Every: logEvery}}
	s.owner = own(newState(&s.o, s.stats, s.due), s.stopped)
	return s
}

// newState is an empty state for a service of o.
func newState(o *Options, st *stats, due chan struct{}) *state {
	return &state{o: o, stats: st, streams: map[*stream]struct{}{}, pools: map[string]*pool{}, dueSignal: due}
}

// Run runs the rounds, one at a time, until ctx is done: every Push a
// round over every bucket, and between them, as soon as a report leaves
// some, a round at once over the buckets due one (see report). A round at
// once that panics ends the streams whose buckets it served; a push that
// panics is counted and logged, and the next one runs. Once Run has
// returned, the service serves nothing more: its streams end Unavailable.
func (s *Service) Run(ctx context.Context) {
	t := time.NewTicker(s.o.Push)
	defer t.Stop()
	defer close(s.stopped)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = s.guard("a grant round", func() error { return s.round(ctx, nil) })
		case <-s.due:
			var due []*bucket
			if s.do("taking the buckets due a round", func(g *state) { due = g.takeAtOnce() }) != nil || len(due) == 0 {
				continue
			}
			if err := s.guard("a grant round", func() error { return s.round(ctx, due) }); err != nil {
				s.fail(due, err)
			}
		}
	}
}

// takeAtOnce is the buckets queued for a round at once, taken.
func (g *state) takeAtOnce() []*bucket {
	due := g.atOnce
	for _, b := range due {
		b.queued = false
	}
	g.atOnce = nil
	return due
}

// fail ends the streams of buckets with err. A bucket's stream, and its
// failed channel, never change once made, so reading them here, off the
// owner, is safe.
func (s *Service) fail(buckets []*bucket, err error) {
	for _, b := range buckets {
		select {
		case b.s.failed <- err:
		default: // it has one already
		}
	}
}

func (g *state) drop(b *bucket) {
	b.gone = true
	g.leave(b)
	delete(b.s.buckets, bucketKey(b.values))
	g.buckets--
	b.s.idBytes -= b.idBytes
	g.idBytes -= b.idBytes
}

// leave takes the bucket out of its pools.
func (g *state) leave(b *bucket) {
	for _, m := range b.members {
		delete(m.p.members, m)
		if len(m.p.members) == 0 && g.pools[m.p.key] == m.p {
			delete(g.pools, m.p.key)
		}
	}
	b.members = nil
}

// take hands one message of usage to the owner, and queues the buckets it
// leaves due a round at once for Run.
func (s *Service) take(st *stream, msg *rlqsv3.RateLimitQuotaUsageReports) error {
	return s.do("a usage report", func(g *state) { g.dueAtOnce(g.report(st, msg)) })
}

// dueAtOnce queues buckets due a round at once, each once, and tells
// Run: a bucket in a round twice would be granted twice in one message.
func (g *state) dueAtOnce(due []*bucket) {
	if len(due) == 0 {
		return
	}
	for _, b := range due {
		if !b.queued {
			b.queued = true
			g.atOnce = append(g.atOnce, b)
		}
	}
	select {
	case g.dueSignal <- struct{}{}:
	default: // a signal is waiting already
	}
}

// report takes one message of usage and returns the buckets due a round
// at once: those it created, and those whose demand it measured for the
// first time or lowered past chance (see noteUsage), these at most once a
// push for the stream. An Envoy reports every bucket in one message every
// 5 s; a client that sent each bucket's falls in messages of their own
// would otherwise have each answered by a round of its own, where the
// push answers them all in one.
func (g *state) report(st *stream, msg *rlqsv3.RateLimitQuotaUsageReports) []*bucket {
	now := g.o.Clock()
	if st.closed {
		return nil
	}
	switch d := msg.GetDomain(); {
	case st.domain == "":
		st.domain = d
	case d != "" && d != st.domain:
		// Envoy never changes a stream's domain; keep the first.
		g.stats.anomalies.WithLabelValues("domain_changed").Inc()
	}
	if len(msg.GetBucketQuotaUsages()) == 0 {
		g.stats.anomalies.WithLabelValues("empty_report").Inc()
	}
	var due, fell []*bucket
	for _, u := range msg.GetBucketQuotaUsages() {
		g.stats.reported.WithLabelValues("allowed").Add(float64(u.GetNumRequestsAllowed()))
		g.stats.reported.WithLabelValues("denied").Add(float64(u.GetNumRequestsDenied()))
		values := u.GetBucketId().GetBucket()
		if len(values) == 0 {
			// Envoy sends these when bucket_id_builder is unset and ignores
			// any action for them.
			g.stats.anomalies.WithLabelValues("empty_bucket_id").Inc()
			continue
		}
		key := bucketKey(values)
		b := st.buckets[key]
		if b == nil {
			// A bucket abandoned a moment ago, reported idle: the report
			// was on its way when the abandon went out, and the Envoy has
			// dropped the bucket since. Made anew from it, the bucket would
			// be assigned (an action the Envoy ignores), and the Envoy's
			// own new bucket, when a request makes it, would find it
			// existing and go unanswered until a round. With requests, the
			// Envoy made it anew.
			if at, ok := st.abandoned[key]; ok {
				if now.Sub(at) < abandonedFor && reported(u) == 0 {
					g.stats.anomalies.WithLabelValues("report_after_abandon").Inc()
					continue
				}
				delete(st.abandoned, key)
			}
			if b = g.newBucket(st, u, now); b == nil {
				continue
			}
			due = append(due, b)
		}
		g.noteLending(b, u.GetNumRequestsAllowed(), now)
		if b.noteUsage(u, now) {
			fell = append(fell, b) // a fresh bucket is not measured yet
		}
		if b.kind == kindShadow {
			g.stats.shadow.Add(float64(u.GetNumRequestsAllowed()))
		}
	}
	return append(due, g.answerEarly(st, fell, now)...)
}

// answerEarly is fell, due a round at once, or nothing when the stream
// had one of those within the push (see report).
func (g *state) answerEarly(st *stream, fell []*bucket, now time.Time) []*bucket {
	if len(fell) == 0 || now.Sub(st.early) < g.o.Push {
		return nil
	}
	st.early = now
	return fell
}

func (g *state) newBucket(st *stream, u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, now time.Time) *bucket {
	values := u.GetBucketId().GetBucket()
	if len(st.buckets) >= g.o.MaxBuckets {
		g.stats.refused.WithLabelValues("buckets").Inc()
		return nil
	}
	if g.buckets >= g.o.MaxTotalBuckets {
		g.stats.refused.WithLabelValues("total_buckets").Inc()
		return nil
	}
	size, ok := g.admitID(st, values)
	if !ok {
		return nil
	}
	own := make(map[string]string, len(values))
	for k, v := range values {
		own[k] = v
	}
	b := &bucket{s: st, id: &rlqsv3.BucketId{Bucket: own}, values: own, est: plan.NewDemand(), demand: math.Inf(1),
		lastReport: now, lastTraffic: now, idBytes: size}
	st.buckets[bucketKey(own)] = b
	g.buckets++
	return b
}

// reclassify brings the bucket up to the config in force.
func (g *state) reclassify(b *bucket, cfg *config.Config) {
	if b.cfg == cfg && b.kind != kindNone {
		return
	}
	k, specs := classify(cfg, b.s.domain, b.values)
	old := map[string]*member{}
	for _, m := range b.members {
		old[m.p.key] = m
	}
	g.leave(b)
	b.cfg, b.kind = cfg, k
	for _, sp := range specs {
		p := g.pools[sp.key]
		if p == nil || p.rule != sp.rule {
			// A limit changed under one key: a new pool. The buckets
			// still in the old one join this one as this round
			// reclassifies them.
			p = &pool{key: sp.key, rule: sp.rule, metric: sp.metric, members: map[*member]struct{}{}, frac: 1}
			g.pools[sp.key] = p
		}
		m := old[sp.key]
		if m == nil || m.l.period != sp.rule.Period {
			m = &member{b: b, l: newLedger(sp.rule.Period)}
		}
		m.p = p
		p.members[m] = struct{}{}
		b.members = append(b.members, m)
	}
}
