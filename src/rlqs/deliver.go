package rlqs

import (
	"context"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Delivery: every grant is reserved as if its message reached the Envoy
// within the delivery bound of the round that sent it, and a grant hands
// over (see ledger.handOver) on that bound. The service keeps its own part
// of it: a message leaves (the transport takes it) within the bound or
// never, and a grant hands over only once its message has left. What the
// service cannot see, the way from the transport to the Envoy's reading,
// must fit in what is left of the bound.

// outgoing is one message for a stream, as a round sent it.
type outgoing struct {
	msg *rlqsv3.RateLimitQuotaResponse
	at  time.Time // the round's time: the bound runs from it
	// grants are those it carries, to hand over once it has left;
	// buckets what it renews, which lapse if it never leaves.
	grants  []grantRef
	buckets []*bucket
}

// grantRef names a grant in a member's ledger (see ledger.note).
type grantRef struct {
	m  *member
	id uint64
}

// departure is a message that has left: its grants hand over at the next
// round (rounds alone change ledgers, one at a time), and what
// they free is given back in that round's first store calls.
type departure struct {
	grants    []grantRef
	arrivedBy time.Time
}

// sender is what deliver needs of a stream: gRPC's server stream.
type sender interface {
	Send(*rlqsv3.RateLimitQuotaResponse) error
}

// deliver sends st's messages in order until ctx is done or a send fails.
// A message that waited past the delivery bound is dropped unsent; a send
// that is still blocked when the bound passes (the Envoy does not read,
// so the transport's buffers are full) signals stalled, and the stream's
// handler ends the stream, which fails the send: the message never
// leaves, late, to extend a grant past what the store holds for it.
func (s *Service) deliver(ctx context.Context, gs sender, st *stream, stalled chan<- struct{}) error {
	for {
		var o *outgoing
		select {
		case <-ctx.Done():
			return nil
		case o = <-st.out:
		}
		left := o.at.Add(s.o.Delivery).Sub(s.o.Clock())
		if left <= 0 {
			s.undelivered(o)
			continue
		}
		timer := time.AfterFunc(left, func() {
			select {
			case stalled <- struct{}{}:
			default:
			}
		})
		var err error
		for _, part := range splitResponse(o.msg, maxPushBytes) {
			if err = gs.Send(part); err != nil {
				break
			}
		}
		if !timer.Stop() {
			// The bound passed during the send: the stream is ending.
			s.undelivered(o)
			return nil
		}
		if err != nil {
			s.undelivered(o)
			return err
		}
		s.delivered(o)
	}
}

// maxPushBytes is the most one message of assignments may take: gRPC
// clients refuse messages past a limit of their own (grpc-java's and
// grpc-go's default is 4 MiB, and one push of 36.5 MB broke such a client),
// so a push of many buckets, or of large ids, goes as several messages,
// each a whole number of actions.
const maxPushBytes = 1 << 20

// splitResponse splits msg into messages of at most max bytes each (an
// action larger by itself goes alone), in order; msg itself when it fits.
func splitResponse(msg *rlqsv3.RateLimitQuotaResponse, max int) []*rlqsv3.RateLimitQuotaResponse {
	if proto.Size(msg) <= max {
		return []*rlqsv3.RateLimitQuotaResponse{msg}
	}
	var parts []*rlqsv3.RateLimitQuotaResponse
	cur, size := &rlqsv3.RateLimitQuotaResponse{}, 0
	for _, a := range msg.GetBucketAction() {
		// An action's bytes in the message: its own, its tag and length.
		n := proto.Size(a) + 1 + protowire.SizeVarint(uint64(proto.Size(a)))
		if size+n > max && len(cur.BucketAction) > 0 {
			parts = append(parts, cur)
			cur, size = &rlqsv3.RateLimitQuotaResponse{}, 0
		}
		cur.BucketAction = append(cur.BucketAction, a)
		size += n
	}
	return append(parts, cur)
}

// delivered notes that o has left: its grants hand over at the next round.
func (s *Service) delivered(o *outgoing) {
	if len(o.grants) == 0 {
		return
	}
	h := departure{o.grants, o.at.Add(s.o.Delivery)}
	_ = s.do("noting a message that left", func(g *state) { g.departed = append(g.departed, h) })
}

// undelivered notes that o never left: what it renewed may lapse before
// the next message, and what it replaced stays in force.
func (s *Service) undelivered(o *outgoing) {
	s.stats.dropped.Inc()
	_ = s.do("noting a message that never left", func(g *state) {
		for _, b := range o.buckets {
			b.lapsed = true
		}
	})
}

// handOvers hands over the grants whose messages have left since the last
// round and returns what the store holds past their need, as asks to give
// back. Run on the owner, before the round plans.
func (g *state) handOvers(now time.Time) []*ask {
	var back []*ask
	for _, h := range g.departed {
		for _, r := range h.grants {
			m := r.m
			m.l.handOver(now, h.arrivedBy, r.id, func(w int64, n uint64) {
				back = append(back, &ask{rule: m.p.rule, window: w, tokens: n, at: maxTime(m.l.start(w), now), key: m.p.key, back: true})
			})
		}
	}
	g.departed = nil
	return back
}
