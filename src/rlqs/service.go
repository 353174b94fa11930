package rlqs

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/logthrottle"
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

// Check reports settings that cannot work.
func (o Options) Check() error {
	o = o.withDefaults()
	if o.TTL < time.Second {
		return errors.New("RLQS_ASSIGNMENT_TTL must be at least 1s: Envoy reads whole seconds, and 0 expires at once")
	}
	if o.TTL <= o.Push+o.Delivery {
		return errors.New("RLQS_ASSIGNMENT_TTL must exceed RLQS_PUSH_INTERVAL plus RLQS_DELIVERY_BOUND, or assignments lapse between renewals")
	}
	return nil
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
	// handed is the messages that have left since the last round, whose
	// grants that round hands over (see deliver.go).
	handed []handed
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

// stream is one Envoy's stream for one domain.
type stream struct {
	id      uint64
	domain  string
	buckets map[string]*bucket
	// abandoned holds, by bucket key, when each bucket was abandoned
	// (for abandonedFor): see report.
	abandoned map[string]time.Time
	out       chan *outgoing
	// early is when a report of a fall of demand was last answered at
	// once (see report): at most once a push, so that a client splitting
	// its reports cannot make a round of each.
	early time.Time
	// closed is set when the stream ends: a report its receiver had
	// already read is then dropped, not taken into buckets nobody drops.
	closed bool
	// idBytes is the bytes of its buckets' ids (Options.MaxIDBytes).
	idBytes int
}

// abandonedFor is how long an abandoned bucket's key is remembered: past
// a report interval (Envoy's is 5 s) and its delivery, a report that was
// on its way when the abandon went out has arrived.
const abandonedFor = 30 * time.Second

// StreamRateLimitQuotas serves one Envoy: reports in, assignments out.
func (s *Service) StreamRateLimitQuotas(gs grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	host := peerHost(gs.Context())
	st, err := s.open(host)
	if err != nil {
		return err
	}
	defer s.close(st)
	ctx, cancel := context.WithCancel(gs.Context())
	defer cancel()
	// Reports are read, and sends made, each on a goroutine of its own:
	// a send blocked past the delivery bound must end the stream, which
	// only returning from here does (it fails the blocked send).
	ended := make(chan error, 2)
	stalled := make(chan struct{}, 1)
	go func() { ended <- s.safeDeliver(ctx, gs, st, stalled) }()
	go func() { ended <- s.receive(ctx, gs, st) }()
	select {
	case err = <-ended:
		return err
	case <-stalled:
		s.stats.stalled.Inc()
		return status.Errorf(codes.Unavailable, "rlqs: the Envoy took no assignment for %v (RLQS_DELIVERY_BOUND): stream ended", s.o.Delivery)
	}
}

// receive takes st's reports until the Envoy closes its side or a report
// fails, and answers new buckets at once.
func (s *Service) receive(ctx context.Context, gs grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse], st *stream) error {
	pace := reportPacer{tokens: reportBurst, last: s.o.Clock()}
	var flood reportCounter
	var h *heldReports // reports past the pace, taken in with the next one
	for {
		msg, err := gs.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled {
				return nil // the Envoy closed its side, or went away
			}
			return err
		}
		now := s.o.Clock()
		if limit := 2 * max(s.o.MaxBuckets, DefaultMaxBuckets); !flood.count(now, len(msg.GetBucketQuotaUsages()), limit) {
			s.stats.refused.WithLabelValues("report_rate").Inc()
			s.cool(peerHost(gs.Context()), now)
			return status.Errorf(codes.ResourceExhausted,
				"rlqs: more than %d bucket usages reported in a second on one stream (twice RLQS_MAX_BUCKETS_PER_STREAM, at least its default): stream ended", limit)
		}
		if !pace.take(now) {
			s.stats.anomalies.WithLabelValues("report_held").Inc()
			h = s.hold(h, msg)
			continue
		}
		if h != nil {
			msg, h = h.report(s, msg), nil
		}
		due, err := s.safeReport(st, msg)
		if err != nil {
			return err
		}
		if len(due) > 0 {
			// The initial report is answered at once, and so is a fall
			// of demand: the share hands its room over a round sooner.
			// The round runs to its end even if the stream goes
			// meanwhile: what it reserves is then held for nobody, which
			// is safe; cut short, it would count as a store error.
			if err := s.safeRound(context.WithoutCancel(ctx), due); err != nil {
				return err
			}
		}
	}
}

// A stream's reports are taken in at most reportsPerSecond, in bursts of
// up to reportBurst: Envoy reports once an interval (every 1 s at the
// shortest) and a gRPC client once a bucket's interval and for each new
// bucket, far under it, while 10 streams reporting every 1 ms took 14 s of
// CPU in 15 s and an ordinary call's p99 from 0.9 to 41 ms. A report past
// the pace is held, merged by bucket, and taken in with the next one (a
// bucket's reports less than a second apart are summed anyway, see
// noteUsage): no count is lost while the stream lasts, and nothing of the
// service is touched for it.
const (
	reportsPerSecond = 20
	reportBurst      = 100
)

// A stream that reports more than twice MaxBuckets bucket usages (at
// least twice DefaultMaxBuckets) in a second of the service's clock is
// ended (ResourceExhausted), and its address's new streams refused for
// floodCooldown: that is what
// an Envoy holding the most buckets a stream may, every one of them new,
// sends in a second at its shortest interval (a report of each new bucket
// at once, and of all of them). Even held, a report costs its decoding and
// merging, about 2.7 µs a bucket, almost all of it protobuf's: 10 streams
// of 100 buckets every millisecond took more than a core that way.

// floodCooldown is how long an address whose stream was ended for its
// report rate has its new streams refused, before any of their reports is
// decoded: reopened at once, each stream would cost the same again.
// maxFlooded bounds the addresses remembered.
const (
	floodCooldown = 10 * time.Second
	maxFlooded    = 10_000
)

// cool refuses host's new streams for floodCooldown from now.
func (s *Service) cool(host string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.flooded == nil {
		s.flooded = map[string]time.Time{}
	}
	if len(s.flooded) >= maxFlooded {
		for h, until := range s.flooded {
			if !now.Before(until) {
				delete(s.flooded, h)
			}
		}
		if len(s.flooded) >= maxFlooded {
			return
		}
	}
	s.flooded[host] = now.Add(floodCooldown)
}

// peerHost is the client's address without its port ("" when unknown).
func peerHost(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	if a, ok := p.Addr.(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return p.Addr.String()
}

// reportCounter counts a stream's bucket usages in the current second of
// the service's clock.
type reportCounter struct {
	second int64
	n      int
}

// count counts n usages at now, and reports whether the stream is still
// within max in this second.
func (c *reportCounter) count(now time.Time, n, max int) bool {
	if s := now.Unix(); s != c.second {
		c.second, c.n = s, 0
	}
	c.n += n
	return c.n <= max
}

// reportPacer is a stream's pace of reports: a token bucket on the
// service's clock.
type reportPacer struct {
	tokens float64
	last   time.Time
}

// take reports whether a report may be taken in at now.
func (p *reportPacer) take(now time.Time) bool {
	if d := now.Sub(p.last); d > 0 {
		p.tokens = min(reportBurst, p.tokens+d.Seconds()*reportsPerSecond)
	}
	p.last = now
	if p.tokens < 1 {
		return false
	}
	p.tokens--
	return true
}

// heldReports is a stream's reports past the pace, merged by bucket: each
// bucket's requests and time summed, as one report of the span.
type heldReports struct {
	domain string
	byKey  map[string]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
	order  []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
}

// hold merges msg's usages into h (nil: none held yet); past MaxBuckets
// buckets held, a new bucket's usage is dropped (a client sending that
// many that fast is not an Envoy).
func (s *Service) hold(h *heldReports, msg *rlqsv3.RateLimitQuotaUsageReports) *heldReports {
	if h == nil {
		h = &heldReports{byKey: map[string]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{}}
	}
	if h.domain == "" {
		h.domain = msg.GetDomain()
	}
	for _, u := range msg.GetBucketQuotaUsages() {
		key := bucketKey(u.GetBucketId().GetBucket())
		if m := h.byKey[key]; m != nil {
			m.NumRequestsAllowed += u.GetNumRequestsAllowed()
			m.NumRequestsDenied += u.GetNumRequestsDenied()
			m.TimeElapsed = durationpb.New(m.GetTimeElapsed().AsDuration() + u.GetTimeElapsed().AsDuration())
			continue
		}
		if len(h.order) >= s.o.MaxBuckets {
			s.stats.anomalies.WithLabelValues("report_dropped").Inc()
			continue
		}
		m := proto.CloneOf(u)
		h.byKey[key] = m
		h.order = append(h.order, m)
	}
	return h
}

// report is what h holds, with msg merged in, as one message.
func (h *heldReports) report(s *Service, msg *rlqsv3.RateLimitQuotaUsageReports) *rlqsv3.RateLimitQuotaUsageReports {
	s.hold(h, msg)
	return &rlqsv3.RateLimitQuotaUsageReports{Domain: h.domain, BucketQuotaUsages: h.order}
}

// safeRound is round, a panic in it recovered (see recovered): the locks
// it holds are released on the way out (round and locked defer them).
func (s *Service) safeRound(ctx context.Context, only []*bucket) (err error) {
	defer s.recovered(&err, "a grant round")
	s.round(ctx, only)
	return nil
}

func (s *Service) open(host string) (*stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if until, ok := s.flooded[host]; ok {
		if s.o.Clock().Before(until) {
			s.stats.refused.WithLabelValues("report_rate").Inc()
			return nil, status.Errorf(codes.ResourceExhausted, "rlqs: a stream of this address reported too fast; new streams refused until %v",
				until.UTC().Format(time.RFC3339))
		}
		delete(s.flooded, host)
	}
	if len(s.streams) >= s.o.MaxStreams {
		s.stats.refused.WithLabelValues("streams").Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "this service already serves %d RLQS streams (RLQS_MAX_STREAMS)", s.o.MaxStreams)
	}
	s.nextID++
	st := &stream{id: s.nextID, buckets: map[string]*bucket{}, abandoned: map[string]time.Time{},
		out: make(chan *outgoing, 8)}
	s.streams[st] = struct{}{}
	return st, nil
}

// close forgets the stream. What the store holds for its buckets stays
// held until the windows pass: the Envoy may still enforce what it was
// sent.
func (s *Service) close(st *stream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range st.buckets {
		s.drop(b)
	}
	st.closed = true
	delete(s.streams, st)
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
	if len(values) > maxEntries {
		s.stats.refused.WithLabelValues("bucket_id_entries").Inc()
		return nil
	}
	size := 0
	for k, v := range values {
		if len(k) > maxField || len(v) > maxField {
			s.stats.refused.WithLabelValues("bucket_id_size").Inc()
			return nil
		}
		size += len(k) + len(v)
	}
	switch {
	case size > maxIDBytes:
		s.stats.refused.WithLabelValues("bucket_id_size").Inc()
		return nil
	case st.idBytes+size > s.o.MaxIDBytes:
		s.stats.refused.WithLabelValues("bucket_id_bytes").Inc()
		return nil
	case s.idBytes+size > s.o.MaxTotalIDBytes:
		s.stats.refused.WithLabelValues("total_bucket_id_bytes").Inc()
		return nil
	}
	st.idBytes += size
	s.idBytes += size
	own := make(map[string]string, len(values))
	for k, v := range values {
		own[k] = v
	}
	b := &bucket{s: st, id: &rlqsv3.BucketId{Bucket: own}, values: own, demand: math.Inf(1),
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
