package rlqs

import (
	"context"
	"errors"
	"io"
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
	// failed carries the error of a round at once over its buckets that
	// panicked (see Run), which ends the stream; buffered 1.
	failed chan error
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
	go func() {
		ended <- s.guard("sending a stream's assignments", func() error { return s.deliver(ctx, gs, st, stalled) })
	}()
	go func() { ended <- s.guard("a usage report", func() error { return s.receive(ctx, gs, st) }) }()
	select {
	case err = <-ended:
		return err
	case err = <-st.failed:
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
		if err := s.take(st, msg); err != nil {
			return err
		}
	}
}

// open opens a stream for a client of host, or says why not.
func (s *Service) open(host string) (st *stream, err error) {
	if perr := s.do("opening a stream", func(g *state) { st, err = g.open(host) }); perr != nil {
		return nil, perr
	}
	return st, err
}

// close forgets the stream (see state.close).
func (s *Service) close(st *stream) {
	_ = s.do("closing a stream", func(g *state) { g.close(st) })
}

func (g *state) open(host string) (*stream, error) {
	if until, ok := g.flooded[host]; ok {
		if g.o.Clock().Before(until) {
			g.stats.refused.WithLabelValues("report_rate").Inc()
			return nil, status.Errorf(codes.ResourceExhausted, "rlqs: a stream of this address reported too fast; new streams refused until %v",
				until.UTC().Format(time.RFC3339))
		}
		delete(g.flooded, host)
	}
	if len(g.streams) >= g.o.MaxStreams {
		g.stats.refused.WithLabelValues("streams").Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "this service already serves %d RLQS streams (RLQS_MAX_STREAMS)", g.o.MaxStreams)
	}
	g.nextID++
	st := &stream{id: g.nextID, buckets: map[string]*bucket{}, abandoned: map[string]time.Time{},
		out: make(chan *outgoing, 8), failed: make(chan error, 1)}
	g.streams[st] = struct{}{}
	return st, nil
}

// close forgets the stream. What the store holds for its buckets stays
// held until the windows pass: the Envoy may still enforce what it was
// sent.
func (g *state) close(st *stream) {
	for _, b := range st.buckets {
		g.drop(b)
	}
	st.closed = true
	delete(g.streams, st)
}
