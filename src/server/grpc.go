package server

import (
	"slices"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/openrls/ratelimit/src/server/h2guard"
)

// grpcOptions are the gRPC server's options: the caller's, TLS, bounds on
// what one client may hold, keepalive, and the lenient codec.
func grpcOptions(o Options, gl *h2guard.Listener) []grpc.ServerOption {
	sopts := slices.Clone(o.GRPCOptions)
	budget := newByteBudget(o.Guard.Bytes)
	if o.TLS != nil {
		sopts = append(sopts, grpc.Creds(gl.Creds(credentials.NewTLS(o.TLS))))
	}
	sopts = append(sopts,
		grpc.MaxRecvMsgSize(o.MaxRequestBytes),
		grpc.MaxConcurrentStreams(o.MaxConcurrentStreams),
		grpc.ConnectionTimeout(o.Timeouts.Handshake),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time: o.Timeouts.KeepaliveTime, Timeout: o.Timeouts.KeepaliveTimeout, MaxConnectionIdle: o.MaxConnectionIdle,
			MaxConnectionAge: o.MaxConnectionAge, MaxConnectionAgeGrace: o.MaxConnectionAgeGrace}),
		// The budget's interceptor first: it settles every request the
		// codec took bytes for, whatever the others answer.
		grpc.ChainUnaryInterceptor(budget.interceptor(func() { o.OnGuard(h2guard.EventCallRefused) }),
			h2guard.InFlightLimit(o.Guard.MaxInFlight, o.OnGuard)),
		keepaliveEnforcement(keepaliveMinTime),
		grpc.ForceServerCodecV2(newLenientCodec(budget)))
	return append(sopts, Tuning()...)
}

// syncGRPCHealth mirrors Health into the gRPC health service, so that gRPC
// health checks see what /healthcheck sees.
func syncGRPCHealth(h *Health, hs *health.Server, stop <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		st := healthpb.HealthCheckResponse_SERVING
		if h.Check() != nil {
			st = healthpb.HealthCheckResponse_NOT_SERVING
		}
		hs.SetServingStatus("", st)
		hs.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, st)
		// The name envoyproxy/ratelimit registers, which probes written
		// for it ask for.
		hs.SetServingStatus("ratelimit", st)
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// streamWorkers is how many goroutines serve RPCs and stay between them.
// grpc-go otherwise starts a goroutine per RPC, which grows its stack on
// every call: stack copying showed in CPU profiles under load.
// Pooled workers keep their grown stacks. RPCs beyond this many at once
// still get a goroutine each, so this is no limit on concurrency.
const streamWorkers = 128

// Tuning is the gRPC server options the service runs with, beyond its
// settings; the load benchmark's no-op server uses them too, so that its
// ceiling is measured on the same stack.
func Tuning() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.NumStreamWorkers(streamWorkers)}
}

// keepaliveMinTime is how often a client may ping (HTTP/2 PING).
const keepaliveMinTime = 10 * time.Second

// keepaliveEnforcement lets clients ping as often as every minTime, with or
// without calls in flight. grpc-go's default (no more than every 5 minutes,
// and only during calls) answers Envoy's HTTP/2 connection keepalive,
// commonly set to 30 or 60 s on the rate limit cluster, with GOAWAY
// "too_many_pings": the connection drops and Envoy redials it.
func keepaliveEnforcement(minTime time.Duration) grpc.ServerOption {
	return grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: minTime, PermitWithoutStream: true})
}
