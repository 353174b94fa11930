package server

import (
	"context"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/openrls/ratelimit/src/server/h2guard"
)

// TestByteBudget: the codec takes a large request's bytes before decoding
// it; one past the budget is left undecoded and answered ResourceExhausted
// by the interceptor; bytes come back once a call is answered, whatever
// the handler returns; small requests take nothing.
func TestByteBudget(t *testing.T) {
	wire := func(valueBytes int) mem.BufferSlice {
		b, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{
			Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: strings.Repeat("v", valueBytes)}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}
	}
	big := wire(40 << 10)
	budget := newByteBudget(h2guard.NewBudget(100 << 10)) // two big requests fit, not three
	codec := newLenientCodec(budget)
	refusals := 0
	intercept := budget.interceptor(func() { refusals++ })
	decode := func(data mem.BufferSlice) *rlsv3.RateLimitRequest {
		t.Helper()
		req := &rlsv3.RateLimitRequest{}
		if err := codec.Unmarshal(data, req); err != nil {
			t.Fatal(err)
		}
		return req
	}
	// call runs the interceptor on req; the handler, if reached, runs
	// inner before it returns (as a request still being handled).
	call := func(req *rlsv3.RateLimitRequest, inner func()) error {
		_, err := intercept(context.Background(), req, &grpc.UnaryServerInfo{}, func(context.Context, any) (any, error) {
			inner()
			return nil, status.Error(codes.Unavailable, "the handler's own error")
		})
		return err
	}
	first, second := decode(big), decode(big)
	if first.GetDomain() != "d" || second.GetDomain() != "d" {
		t.Fatal("requests within the budget were not decoded")
	}
	if small := decode(wire(10)); small.GetDomain() != "d" || call(small, func() {}) == nil {
		t.Fatal("a small request past the budget was not decoded and handled")
	}
	var third *rlsv3.RateLimitRequest
	err := call(first, func() {
		third = decode(big)
		if third.GetDomain() != "" {
			t.Error("a request past the budget was decoded")
		}
		if err := call(third, func() { t.Error("a request past the budget reached the handler") }); status.Code(err) != codes.ResourceExhausted ||
			!strings.Contains(err.Error(), "GRPC_MAX_REQUEST_BYTES_IN_FLIGHT") {
			t.Errorf("a request past the budget: %v, want ResourceExhausted naming the setting", err)
		}
	})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("the handler's answer came back as %v", err)
	}
	if refusals != 1 {
		t.Errorf("%d refusals noted, want 1", refusals)
	}
	// first is answered: its bytes are back, and another fits beside second.
	if again := decode(big); again.GetDomain() != "d" {
		t.Error("after a call was answered, a request that fits was not decoded")
	}
	_ = call(second, func() {})
	if got := budget.Used(); got != int64(big.Len()) {
		t.Errorf("%d bytes in use, want the one request still held (%d)", got, big.Len())
	}
	if got := budget.entries.Load(); got != 1 {
		t.Errorf("%d requests tracked, want the one still held: a settled one left an entry behind", got)
	}
	// A request that fails to decode gives its bytes back at once.
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(append([]byte{0xff}, big.Materialize()...))}, &rlsv3.RateLimitRequest{}); err == nil {
		t.Fatal("a malformed request decoded")
	}
	if got := budget.Used(); got != int64(big.Len()) {
		t.Errorf("%d bytes in use after a malformed request, want %d", got, big.Len())
	}
}
