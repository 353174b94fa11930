package rlqs

import (
	"context"
	"errors"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openrls/ratelimit/src/limiter"
)

// fakeSender takes messages as a stream's transport does; with block set,
// a send waits until block is closed and then fails, as gRPC fails a send
// on a stream that has ended.
type fakeSender struct {
	took  chan *rlqsv3.RateLimitQuotaResponse
	block chan struct{}
}

var errEnded = errors.New("fakeSender: the stream ended")

func (f *fakeSender) Send(m *rlqsv3.RateLimitQuotaResponse) error {
	if f.block != nil {
		<-f.block
		return errEnded
	}
	f.took <- m
	return nil
}

// TestAMessageLeavesWithinTheBoundOrNever: a round's message leaves
// within the delivery bound of the round, and only then hands its grants
// over; one that waited in the stream's queue past the bound is dropped
// unsent, and a send still blocked when the bound passes signals the
// stream's handler to end the stream (which fails the send). Either way
// nothing is handed over and what the message renewed may lapse.
func TestAMessageLeavesWithinTheBoundOrNever(t *testing.T) {
	now := time.Unix(1_700_000_000, 300_000_000)
	for _, tc := range []struct {
		name    string
		waited  time.Duration // in the queue before the sender takes it
		blocked bool          // the send blocks
		leaves  bool
	}{
		{"on time", 0, false, true},
		{"waited past the bound", time.Second, false, false},
		{"blocked past the bound", 0, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, st := fleetStream(t, func() time.Time { return now })
			if tc.blocked {
				// The stall is timed on the process's clock: a short bound
				// keeps the test short; nothing asserts how long it took.
				s.o.Delivery = 20 * time.Millisecond
			}
			b := &bucket{s: st}
			m := &member{b: b, l: newLedger(time.Second)}
			st.out <- &outgoing{msg: &rlqsv3.RateLimitQuotaResponse{}, at: now.Add(-tc.waited), grants: []grantRef{{m, 1}}, buckets: []*bucket{b}}
			f := &fakeSender{took: make(chan *rlqsv3.RateLimitQuotaResponse, 1)}
			if tc.blocked {
				f.block = make(chan struct{})
			}
			ctx, cancel := context.WithCancel(context.Background())
			stalled := make(chan struct{}, 1)
			done := make(chan error, 1)
			go func() { done <- s.deliver(ctx, f, st, stalled) }()
			switch {
			case tc.blocked:
				<-stalled
				close(f.block)
			case tc.leaves:
				<-f.took
			}
			// deliver takes the queue in order: once it has taken a second
			// message, it has settled the first.
			st.out <- &outgoing{msg: &rlqsv3.RateLimitQuotaResponse{}, at: now}
			if !tc.blocked {
				<-f.took
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("deliver: %v", err)
			}
			var dropped dto.Metric
			if err := s.stats.dropped.Write(&dropped); err != nil {
				t.Fatal(err)
			}
			var departed int
			var lapsed bool
			owned(t, s, func(g *state) { departed, lapsed = len(g.departed), b.lapsed })
			switch {
			case tc.leaves && (departed != 1 || lapsed || dropped.GetCounter().GetValue() != 0):
				t.Errorf("a message that left: %d hand-overs noted (want 1), lapsed %v, %v dropped", departed, lapsed, dropped.GetCounter().GetValue())
			case !tc.leaves && (departed != 0 || !lapsed || dropped.GetCounter().GetValue() != 1):
				t.Errorf("a message that never left: %d hand-overs noted (want 0), lapsed %v (want true), %v dropped (want 1)", departed, lapsed, dropped.GetCounter().GetValue())
			}
		})
	}
}

// panickySender panics on every send.
type panickySender struct{}

func (panickySender) Send(*rlqsv3.RateLimitQuotaResponse) error { panic("panickySender") }

// TestAPanicInSendingEndsTheStream: the sender runs on a goroutine of its
// own, where a panic would end the process; it ends the stream instead
// (Internal), counted.
func TestAPanicInSendingEndsTheStream(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s, st := fleetStream(t, func() time.Time { return now })
	st.out <- &outgoing{msg: &rlqsv3.RateLimitQuotaResponse{}, at: now}
	err := s.guard("sending a stream's assignments", func() error {
		return s.deliver(context.Background(), panickySender{}, st, make(chan struct{}, 1))
	})
	if status.Code(err) != codes.Internal {
		t.Errorf("deliver after a panic: %v, want Internal", err)
	}
	var panics dto.Metric
	if err := s.stats.panics.Write(&panics); err != nil || panics.GetCounter().GetValue() != 1 {
		t.Errorf("panics counted: %v, want 1", panics.GetCounter().GetValue())
	}
}

// TestAReportAfterItsStreamClosedIsDropped: reports are read on a
// goroutine of their own, which may hold one already read when the
// stream's handler ends it. Taken, its buckets would be counted against
// the service's bound and granted to nobody, with no close to drop them.
func TestAReportAfterItsStreamClosedIsDropped(t *testing.T) {
	s := New(Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1}), Configs: fleet(t)})
	st, err := s.open("")
	if err != nil {
		t.Fatal(err)
	}
	s.close(st)
	fresh := s.report(st, &rlqsv3.RateLimitQuotaUsageReports{Domain: "fleet", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "a"}}, NumRequestsAllowed: 1}}})
	var buckets, ofStream int
	owned(t, s, func(g *state) { buckets, ofStream = g.buckets, len(st.buckets) })
	if len(fresh) != 0 || buckets != 0 || ofStream != 0 {
		t.Errorf("a report on a closed stream made %d buckets (the service counts %d)", ofStream, buckets)
	}
}
