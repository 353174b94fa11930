package service

import (
	"context"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// FuzzShouldRateLimit feeds arbitrary wire bytes to the handler, as a gRPC
// peer could: whatever decodes must get either InvalidArgument or one status
// per descriptor, never a panic or another code.
func FuzzShouldRateLimit(f *testing.F) {
	seeds := []*rlsv3.RateLimitRequest{
		req("web", d("ip=1")),
		req("web", d("multi=1"), d("quota=2"), d("nope=3")),
		{Domain: "web", HitsAddend: 1 << 31, Descriptors: []*rlv3.RateLimitDescriptor{{
			Entries:    d("ip=1").Entries,
			HitsAddend: wrapperspb.UInt64(1<<64 - 1),
			Limit:      &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(1 << 30)},
		}}},
		req("", d("=")),
		// A refund of everything, beside a hit.
		{Domain: "web", Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: d("ip=1").Entries, HitsAddend: wrapperspb.UInt64(1<<64 - 1), IsNegativeHits: true},
			{Entries: d("multi=1").Entries}}},
	}
	for _, r := range seeds {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	s := newTestServer(f, Options{})
	f.Fuzz(func(t *testing.T, wire []byte) {
		r := &rlsv3.RateLimitRequest{}
		if proto.Unmarshal(wire, r) != nil {
			return // gRPC would refuse it before the handler
		}
		resp, err := s.ShouldRateLimit(context.Background(), r)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v, want InvalidArgument or an answer", err)
			}
			return
		}
		if len(resp.GetStatuses()) != len(r.GetDescriptors()) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(r.GetDescriptors()))
		}
	})
}
