package rlqs

import (
	"context"
	"math"
	"sync"
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
	// 600 MB at their peak (docs/settings.md).
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
type Service struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	o Options

	// grant serializes grant rounds: a round reads ledgers, asks the
	// store, then commits, and two rounds must not interleave on one.
	grant sync.Mutex

	mu      sync.Mutex // guards everything below and every bucket
	streams map[*stream]struct{}
	// flooded holds, by client address, until when its new streams are
	// refused: one of its streams was ended for its report rate.
	flooded map[string]time.Time
	pools   map[string]*pool
	nextID  uint64
	buckets int // across streams
	idBytes int // their ids' bytes (Options.MaxTotalIDBytes)
	// departed is the messages that have left since the last round, whose
	// grants that round hands over (see deliver.go).
	departed []departure
	// lenders is the buckets reported since the last round, whose
	// reports may give back what they did not use (see lending).
	lenders []*bucket

	stats *stats

	storeLog *logthrottle.Throttle
	panicLog *logthrottle.Throttle
}

// New returns a Service; Run drives its renewals.
func New(o Options) *Service {
	o = o.withDefaults()
	return &Service{o: o, streams: map[*stream]struct{}{}, pools: map[string]*pool{}, stats: newStats(),
		storeLog: &logthrottle.Throttle{Every: logEvery}, panicLog: &logthrottle.Throttle{Every: logEvery}}
}

// Run renews and refills every Push until ctx is done.
func (s *Service) Run(ctx context.Context) {
	t := time.NewTicker(s.o.Push)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = s.safeRound(ctx, nil)
		}
	}
}

// safeRound is round, a panic in it recovered (see recovered): the locks
// it holds are released on the way out (round and locked defer them).
func (s *Service) safeRound(ctx context.Context, only []*bucket) (err error) {
	defer s.recovered(&err, "a grant round")
	s.round(ctx, only)
	return nil
}

func (s *Service) drop(b *bucket) {
	b.gone = true
	s.leave(b)
	delete(b.s.buckets, bucketKey(b.values))
	s.buckets--
	b.s.idBytes -= b.idBytes
	s.idBytes -= b.idBytes
}

// leave takes the bucket out of its pools.
func (s *Service) leave(b *bucket) {
	for _, m := range b.members {
		delete(m.p.members, m)
		if len(m.p.members) == 0 && s.pools[m.p.key] == m.p {
			delete(s.pools, m.p.key)
		}
	}
	b.members = nil
}

// safeReport is report, a panic in it recovered (see recovered).
func (s *Service) safeReport(st *stream, msg *rlqsv3.RateLimitQuotaUsageReports) (due []*bucket, err error) {
	defer s.recovered(&err, "a usage report")
	return s.report(st, msg), nil
}

// report takes one message of usage and returns the buckets due a round
// at once: those it created, and those whose demand it measured for the
// first time or lowered past chance (see noteUsage), these at most once a
// push for the stream. An Envoy reports every bucket in one message every
// 5 s; a client that sent each bucket's falls in messages of their own
// would otherwise have each answered by a round of its own, where the
// push answers them all in one.
func (s *Service) report(st *stream, msg *rlqsv3.RateLimitQuotaUsageReports) []*bucket {
	now := s.o.Clock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.closed {
		return nil
	}
	switch d := msg.GetDomain(); {
	case st.domain == "":
		st.domain = d
	case d != "" && d != st.domain:
		// Envoy never changes a stream's domain; keep the first.
		s.stats.anomalies.WithLabelValues("domain_changed").Inc()
	}
	if len(msg.GetBucketQuotaUsages()) == 0 {
		s.stats.anomalies.WithLabelValues("empty_report").Inc()
	}
	var due, fell []*bucket
	for _, u := range msg.GetBucketQuotaUsages() {
		s.stats.reported.WithLabelValues("allowed").Add(float64(u.GetNumRequestsAllowed()))
		s.stats.reported.WithLabelValues("denied").Add(float64(u.GetNumRequestsDenied()))
		values := u.GetBucketId().GetBucket()
		if len(values) == 0 {
			// Envoy sends these when bucket_id_builder is unset and ignores
			// any action for them.
			s.stats.anomalies.WithLabelValues("empty_bucket_id").Inc()
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
					s.stats.anomalies.WithLabelValues("report_after_abandon").Inc()
					continue
				}
				delete(st.abandoned, key)
			}
			if b = s.newBucket(st, u, now); b == nil {
				continue
			}
			due = append(due, b)
		}
		s.noteLending(b, u.GetNumRequestsAllowed(), now)
		if b.noteUsage(u, now) {
			fell = append(fell, b) // a fresh bucket is not measured yet
		}
		if b.kind == kindShadow {
			s.stats.shadow.Add(float64(u.GetNumRequestsAllowed()))
		}
	}
	return append(due, s.answerEarly(st, fell, now)...)
}

// answerEarly is fell, due a round at once, or nothing when the stream
// had one of those within the push (see report); s.mu held.
func (s *Service) answerEarly(st *stream, fell []*bucket, now time.Time) []*bucket {
	if len(fell) == 0 || now.Sub(st.early) < s.o.Push {
		return nil
	}
	st.early = now
	return fell
}

func (s *Service) newBucket(st *stream, u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, now time.Time) *bucket {
	values := u.GetBucketId().GetBucket()
	if len(st.buckets) >= s.o.MaxBuckets {
		s.stats.refused.WithLabelValues("buckets").Inc()
		return nil
	}
	if s.buckets >= s.o.MaxTotalBuckets {
		s.stats.refused.WithLabelValues("total_buckets").Inc()
		return nil
	}
	size, ok := s.admitID(st, values)
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
	s.buckets++
	return b
}

// reclassify brings the bucket up to the config in force.
func (s *Service) reclassify(b *bucket, cfg *config.Config) {
	if b.cfg == cfg && b.kind != kindNone {
		return
	}
	k, specs := classify(cfg, b.s.domain, b.values)
	old := map[string]*member{}
	for _, m := range b.members {
		old[m.p.key] = m
	}
	s.leave(b)
	b.cfg, b.kind = cfg, k
	for _, sp := range specs {
		p := s.pools[sp.key]
		if p == nil || p.rule != sp.rule {
			// A limit changed under one key: a new pool. The buckets
			// still in the old one join this one as this round
			// reclassifies them.
			p = &pool{key: sp.key, rule: sp.rule, metric: sp.metric, members: map[*member]struct{}{}, frac: 1}
			s.pools[sp.key] = p
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
