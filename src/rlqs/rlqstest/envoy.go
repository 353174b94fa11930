// Package rlqstest is a fake Envoy for tests of RLQS servers: the
// rate_limit_quota filter's client as Envoy 1.40 runs it (see
// docs/rlqs.md for the behaviour it models and where it comes from), or,
// with Profile API, as the API's comments describe it instead.
package rlqstest

import (
	"context"
	"math"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Profile selects which client the fake plays.
type Profile uint8

const (
	// Envoy140 is what Envoy 1.40 does: reports every 5 s (whatever the
	// config says) with every bucket, zero-traffic ones included;
	// time_elapsed in whole seconds and 0 on the initial report; the domain
	// on every message; TTLs and fill intervals read in whole seconds, an
	// unset TTL expiring at once; RequestsPerTimeUnit assignments dropped;
	// token state carried over for an "equal" bucket (capacity,
	// tokens_per_fill, the fill interval's nanos) and rescaled by
	// new/old capacity otherwise; a reconnect only on the report tick.
	Envoy140 Profile = iota
	// API follows the API's text: the domain on the first message only,
	// exact time_elapsed, an unset TTL never expiring.
	API
	// GRPC is gRPC's RLQS client as gRFC A77 describes it: the API's
	// reading, but each bucket reported on a timer of its own, started when
	// the bucket is made (at Options.Bucket's interval for it), in a
	// message of its own.
	GRPC
)

// Options configure a fake Envoy.
type Options struct {
	Conn    grpc.ClientConnInterface
	Domain  string
	Profile Profile
	// Report is the report interval; 0 means Envoy's fixed 5 s.
	Report time.Duration
	// Bucket, when set, is each bucket's own report interval (GRPC only;
	// Report where it returns 0).
	Bucket func(id map[string]string) time.Duration
	// NoAssignment is the no_assignment_behavior: nil means ALLOW_ALL
	// (Envoy's default).
	NoAssignment *typev3.RateLimitStrategy
	// Expired is expired_assignment_behavior's fallback for ExpiredFor;
	// nil means none: the bucket goes back to NoAssignment.
	Expired    *typev3.RateLimitStrategy
	ExpiredFor time.Duration
	// OnAdmit, when set, hears of every allowed request.
	OnAdmit func(bucket string, at time.Time)
	// OnMessage, when set, hears of every report sent and every response
	// taken, as they happen (with the Envoy's lock held: it must not call
	// back).
	OnMessage func(m proto.Message, at time.Time)
}

// Deny and Allow are blanket strategies for Options.
var (
	Deny  = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	Allow = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}}
)

// Envoy is one fake Envoy process with one RLQS stream for one domain.
type Envoy struct {
	o      Options
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	stream  grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	end     context.CancelFunc // ends the current stream
	sentOne bool
	buckets map[string]*bucket
	last    time.Time
	// streams counts the streams opened; received the responses; skipped
	// the actions Envoy would ignore (an empty or unknown bucket id);
	// expiries the assignments that expired.
	streams, received, skipped, expiries int
	actions                              []*rlqsv3.RateLimitQuotaResponse_BucketAction
	sent                                 []*rlqsv3.RateLimitQuotaUsageReports
}

type bucket struct {
	id               map[string]string
	allowed, denied  uint64
	action           *typev3.RateLimitStrategy // nil: the default
	tokens, max      float64
	rate             float64 // per second
	tpf              uint32
	nanos            int32
	refilled         time.Time
	expiry, fallback *time.Timer
	epoch            int
	// GRPC: the bucket's own report timer, and its last report.
	ticker *time.Ticker
	last   time.Time
}

// Start runs a fake Envoy until Stop. Like Envoy it opens its stream on
// the first request's bucket, not before.
func Start(o Options) *Envoy {
	if o.Report <= 0 {
		o.Report = 5 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Envoy{o: o, ctx: ctx, cancel: cancel, buckets: map[string]*bucket{}}
	return e
}

// Stop ends the process: its stream is cancelled, its timers stop.
func (e *Envoy) Stop() {
	e.cancel()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, b := range e.buckets {
		b.stopTimers()
		b.stopReports()
	}
}

func (b *bucket) stopTimers() {
	for _, t := range []*time.Timer{b.expiry, b.fallback} {
		if t != nil {
			t.Stop()
		}
	}
}

// stopReports ends a GRPC bucket's own report timer.
func (b *bucket) stopReports() {
	if b.ticker != nil {
		b.ticker.Stop()
		b.ticker = nil
	}
}

// Break ends the current stream as a broken connection would; like
// Envoy, the fake opens a new one on its next report tick.
func (e *Envoy) Break() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.end != nil {
		e.end()
	}
	e.stream = nil
}

// Request runs one request through the filter and reports whether it was
// allowed.
func (e *Envoy) Request(id map[string]string) bool {
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	key := keyOf(id)
	b := e.buckets[key]
	first := b == nil
	if first {
		b = &bucket{id: id}
		e.buckets[key] = b
	}
	ok := e.decide(b, now, first)
	if ok {
		b.allowed++
	} else {
		b.denied++
	}
	if first {
		e.startLocked()
		if e.o.Profile == GRPC {
			e.startBucketReports(b, now)
		}
		if e.stream != nil { // Envoy drops the initial report when the stream is down
			u := e.usage(b, 0)
			e.send(&rlqsv3.RateLimitQuotaUsageReports{Domain: e.o.Domain, BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{u}})
		}
	}
	if ok && e.o.OnAdmit != nil {
		e.o.OnAdmit(key, now)
	}
	return ok
}

// decide applies the bucket's action: a blanket rule, a token bucket, or
// (no assignment) the default, where only DENY_ALL denies the first
// request and RequestsPerTimeUnit allows.
func (e *Envoy) decide(b *bucket, now time.Time, first bool) bool {
	a := b.action
	if a == nil {
		a = e.o.NoAssignment
	}
	switch {
	case a == nil:
		return true
	case a.GetTokenBucket() != nil && b.action != nil:
		b.tokens = math.Min(b.max, b.tokens+now.Sub(b.refilled).Seconds()*b.rate)
		b.refilled = now
		if b.tokens >= 1 {
			b.tokens--
			return true
		}
		return false
	case a.GetStrategy() == nil:
		return true
	}
	if _, blanket := a.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_); blanket {
		return a.GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL
	}
	return true
}

func (e *Envoy) usage(b *bucket, elapsed time.Duration) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
	if e.o.Profile == Envoy140 {
		elapsed = elapsed.Truncate(time.Second)
	}
	u := &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: b.id},
		TimeElapsed: durationpb.New(elapsed), NumRequestsAllowed: b.allowed, NumRequestsDenied: b.denied}
	b.allowed, b.denied = 0, 0
	return u
}

func (e *Envoy) send(m *rlqsv3.RateLimitQuotaUsageReports) {
	if e.o.Profile != Envoy140 && e.sentOne {
		m.Domain = ""
	}
	if err := e.stream.Send(m); err != nil {
		e.stream = nil
		return
	}
	e.sent = append(e.sent, m)
	e.sentOne = true
	if e.o.OnMessage != nil {
		e.o.OnMessage(m, time.Now())
	}
}

// startLocked opens the stream and the report timer on first use.
func (e *Envoy) startLocked() {
	if e.streams > 0 {
		return
	}
	e.open()
	e.last = time.Now()
	if e.o.Profile != GRPC {
		go e.reportLoop()
	}
}

func (e *Envoy) open() {
	ctx, end := context.WithCancel(e.ctx)
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(e.o.Conn).StreamRateLimitQuotas(ctx)
	e.streams++
	if err != nil {
		end()
		return
	}
	e.stream, e.end, e.sentOne = st, end, false
	go e.recvLoop(st)
}

func (e *Envoy) recvLoop(st grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) {
	for {
		resp, err := st.Recv()
		e.mu.Lock()
		if err != nil {
			if e.stream == st {
				e.stream = nil
			}
			e.mu.Unlock()
			return
		}
		e.received++
		if e.o.OnMessage != nil {
			e.o.OnMessage(resp, time.Now())
		}
		for _, a := range resp.GetBucketAction() {
			e.actions = append(e.actions, a)
			e.apply(a, time.Now())
		}
		e.mu.Unlock()
	}
}

// apply takes one action in order: an unknown or empty id is skipped; an
// abandon erases the bucket; an assignment with a strategy Envoy does not
// enforce (RequestsPerTimeUnit, none) is dropped.
func (e *Envoy) apply(a *rlqsv3.RateLimitQuotaResponse_BucketAction, now time.Time) {
	id := a.GetBucketId().GetBucket()
	b := e.buckets[keyOf(id)]
	if len(id) == 0 || b == nil {
		e.skipped++
		return
	}
	if a.GetAbandonAction() != nil {
		b.stopTimers()
		b.stopReports()
		delete(e.buckets, keyOf(id))
		return
	}
	qa := a.GetQuotaAssignmentAction()
	strat := qa.GetRateLimitStrategy()
	switch strat.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_, *typev3.RateLimitStrategy_TokenBucket:
	default:
		return
	}
	e.install(b, strat, now)
	ttl := qa.GetAssignmentTimeToLive().AsDuration()
	if e.o.Profile == Envoy140 {
		ttl = time.Duration(qa.GetAssignmentTimeToLive().GetSeconds()) * time.Second
	} else if qa.GetAssignmentTimeToLive() == nil {
		return // the API: no expiry
	}
	b.stopTimers()
	b.epoch++
	epoch := b.epoch
	b.expiry = time.AfterFunc(ttl, func() { e.expire(b, epoch) })
}

// install sets a strategy, carrying or rescaling token state as Envoy does.
func (e *Envoy) install(b *bucket, strat *typev3.RateLimitStrategy, now time.Time) {
	tb := strat.GetTokenBucket()
	if tb == nil {
		b.action = strat
		return
	}
	fill := float64(tb.GetFillInterval().GetSeconds())
	rate := float64(tb.GetTokensPerFill().GetValue()) / fill
	old := b.action.GetTokenBucket()
	switch {
	case old != nil && old.GetMaxTokens() == tb.GetMaxTokens() && b.tpf == tb.GetTokensPerFill().GetValue() && b.nanos == tb.GetFillInterval().GetNanos():
		// "equal": the limiter and its tokens carry over.
	case old != nil:
		b.tokens = math.Min(b.max, b.tokens+now.Sub(b.refilled).Seconds()*b.rate)
		b.tokens = math.Floor(float64(tb.GetMaxTokens()) * b.tokens / b.max)
		b.max, b.rate, b.refilled = float64(tb.GetMaxTokens()), rate, now
	default:
		b.tokens, b.max, b.rate, b.refilled = float64(tb.GetMaxTokens()), float64(tb.GetMaxTokens()), rate, now
	}
	b.tpf, b.nanos = tb.GetTokensPerFill().GetValue(), tb.GetFillInterval().GetNanos()
	b.action = strat
}

// expire moves an expired bucket to the fallback, or back to the default.
func (e *Envoy) expire(b *bucket, epoch int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if b.epoch != epoch {
		return
	}
	e.expiries++
	if e.o.Expired == nil {
		b.action = nil
		return
	}
	e.install(b, e.o.Expired, time.Now())
	b.fallback = time.AfterFunc(e.o.ExpiredFor.Truncate(time.Second), func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if b.epoch == epoch {
			b.action = nil
		}
	})
}

func keyOf(id map[string]string) string { return bucketKeyString(id) }
