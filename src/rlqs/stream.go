package rlqs

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A stream's life: opened, its reports read and its assignments sent, each
// on a goroutine of its own, and closed.

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
	// atOnce is the buckets due a round at once that its rounds goroutine
	// has not taken yet (see answerAtOnce), guarded by its own lock: the
	// reports' reader only hands them over and reads on.
	atOnceMu sync.Mutex
	atOnce   []*bucket
	atOnceIn chan struct{} // a signal, buffered 1
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
	ended := make(chan error, 3)
	stalled := make(chan struct{}, 1)
	go func() { ended <- s.safeDeliver(ctx, gs, st, stalled) }()
	go func() { ended <- s.receive(ctx, gs, st) }()
	go func() { ended <- s.answerAtOnce(ctx, st) }()
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
			st.dueAtOnce(due)
		}
	}
}

// dueAtOnce hands buckets due a round at once to the stream's rounds
// goroutine (answerAtOnce), merged with those it has not taken yet.
func (st *stream) dueAtOnce(due []*bucket) {
	st.atOnceMu.Lock()
	st.atOnce = append(st.atOnce, due...)
	st.atOnceMu.Unlock()
	select {
	case st.atOnceIn <- struct{}{}:
	default: // a signal is waiting already
	}
}

// answerAtOnce runs the rounds at once of st's reports, until ctx is done.
// The initial report is answered at once, and so is a fall of demand: the
// share hands its room over a round sooner. They run here, not on the
// reports' reader, so that a round (a store call, a wait for the round
// before it) never stops the reading: unread, a report of several frames
// would wait for flow-control window, and a client behind it with it. A
// round runs to its end even if the stream goes meanwhile: what it
// reserves is then held for nobody, which is safe; cut short, it would
// count as a store error.
func (s *Service) answerAtOnce(ctx context.Context, st *stream) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-st.atOnceIn:
		}
		st.atOnceMu.Lock()
		due := st.atOnce
		st.atOnce = nil
		st.atOnceMu.Unlock()
		if err := s.safeRound(context.WithoutCancel(ctx), due); err != nil {
			return err
		}
	}
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
		out: make(chan *outgoing, 8), atOnceIn: make(chan struct{}, 1)}
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
