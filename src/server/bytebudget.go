package server

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/openrls/ratelimit/src/server/h2guard"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// byteBudget bounds the bytes of large ShouldRateLimit requests being
// handled at once (GRPC_MAX_REQUEST_BYTES_IN_FLIGHT). A request costs
// several times its size while it is decoded, matched and counted (its
// keys, stat names and answer): 400 concurrent requests at the default
// REQUEST_MAX_BYTES took 800 MB. The codec takes a large request's bytes
// from the budget before decoding it; past the budget it does not decode
// it, and the interceptor answers it ResourceExhausted at once, as for
// GRPC_MAX_CALLS_IN_FLIGHT. Requests under untracked bytes (all of Envoy's,
// in practice) are left to the calls-in-flight cap, which bounds them at
// a few MB: they cost no map operation.
//
// The budget itself (h2guard.Budget) is shared with the gRPC listener's
// guards, which count a request's bytes against it while they arrive.
type byteBudget struct {
	*h2guard.Budget
	// taken maps a request the codec decoded to the bytes it took;
	// refused holds those it did not decode. The interceptor, which runs
	// right after the codec for the same call, settles both.
	taken, refused sync.Map
	// entries counts what the two maps hold: while it is 0 (no large
	// request in flight, the usual case) the interceptor skips them, so a
	// small request costs an atomic load, not two map operations. A
	// request's own entry is stored before its interceptor runs, in the
	// same goroutine, so a request with one never sees 0.
	entries atomic.Int64
}

// untracked is the size under which a request takes nothing.
const untracked = 4 << 10

func newByteBudget(b *h2guard.Budget) *byteBudget { return &byteBudget{Budget: b} }

// admit takes n bytes for req, reporting false (req refused, not to be
// decoded) when they do not fit.
func (b *byteBudget) admit(req *rlsv3.RateLimitRequest, n int) bool {
	if n < untracked {
		return true
	}
	if !b.Take(int64(n)) {
		b.entries.Add(1)
		b.refused.Store(req, struct{}{})
		return false
	}
	b.entries.Add(1)
	b.taken.Store(req, int64(n))
	return true
}

// release gives back what req took, if anything (a decode that failed).
func (b *byteBudget) release(req any) {
	if n, ok := b.taken.LoadAndDelete(req); ok {
		b.Give(n.(int64))
		b.entries.Add(-1)
	}
}

// interceptor answers a request the codec refused, and gives back what a
// decoded one took once it is answered.
func (b *byteBudget) interceptor(note func()) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if _, ok := req.(*rlsv3.RateLimitRequest); !ok || b.entries.Load() == 0 {
			return handler(ctx, req)
		}
		if _, refused := b.refused.LoadAndDelete(req); refused {
			b.entries.Add(-1)
			note()
			return nil, status.Error(codes.ResourceExhausted,
				fmt.Sprintf("more than %d bytes of requests in flight (GRPC_MAX_REQUEST_BYTES_IN_FLIGHT)", b.Max()))
		}
		defer b.release(req)
		return handler(ctx, req)
	}
}
