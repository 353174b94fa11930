// Package server runs the listeners around the RLS handler: gRPC (the RLS
// service, grpc.health.v1 and reflection), HTTP (/healthcheck, /json) and the
// debug port (/debug/pprof/, an index at /, and what main adds: /rlconfig,
// /stats). Run serves until its context ends, then marks the service
// unhealthy and shuts down gracefully.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
)

// Service is what the listeners serve.
type Service interface {
	rlsv3.RateLimitServiceServer
	JSONHandler() http.Handler
}

// Options configures Run.
type Options struct {
	GRPCAddr, HTTPAddr, DebugAddr string
	Service                       Service
	Health                        *Health
	// Debug handlers mounted on the debug port beside /debug/pprof/,
	// e.g. "/rlconfig".
	Debug map[string]http.Handler
	// Metrics is served at /metrics on the HTTP port and, when MetricsAddr
	// is set, at MetricsPath on a listener of its own (USE_PROMETHEUS).
	Metrics                  http.Handler
	MetricsAddr, MetricsPath string
	// TLS, when not nil, serves gRPC over TLS (see NewTLSConfig).
	TLS *tls.Config
	// GRPCOptions are extra gRPC server options (tracing's stats handler).
	GRPCOptions           []grpc.ServerOption
	MaxConnectionAge      time.Duration
	MaxConnectionAgeGrace time.Duration
	ShutdownTimeout       time.Duration // 0 means 10s
	Logger                logrus.FieldLogger
}

// Run listens on every address and serves until ctx is done.
func Run(ctx context.Context, o Options) error {
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = 10 * time.Second
	}
	lis := make([]net.Listener, 0, 3)
	defer func() {
		for _, l := range lis {
			_ = l.Close()
		}
	}()
	addrs := []struct{ name, addr string }{{"gRPC", o.GRPCAddr}, {"HTTP", o.HTTPAddr}, {"debug", o.DebugAddr}}
	if o.MetricsAddr != "" {
		addrs = append(addrs, struct{ name, addr string }{"metrics", o.MetricsAddr})
	}
	for _, a := range addrs {
		l, err := net.Listen("tcp", a.addr)
		if err != nil {
			return fmt.Errorf("listen for %s on %s: %w", a.name, a.addr, err)
		}
		lis = append(lis, l)
		o.Logger.Warnf("listening for %s on %s", a.name, l.Addr())
	}

	sopts := slices.Clone(o.GRPCOptions)
	if o.TLS != nil {
		sopts = append(sopts, grpc.Creds(credentials.NewTLS(o.TLS)))
	}
	if o.MaxConnectionAge > 0 {
		sopts = append(sopts, grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge: o.MaxConnectionAge, MaxConnectionAgeGrace: o.MaxConnectionAgeGrace}))
	}
	sopts = append(sopts, keepaliveEnforcement(keepaliveMinTime),
		grpc.ForceServerCodecV2(newLenientCodec()))
	gs := grpc.NewServer(append(sopts, Tuning()...)...)
	rlsv3.RegisterRateLimitServiceServer(gs, o.Service)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)

	mux := http.NewServeMux()
	mux.Handle("/healthcheck", o.Health)
	mux.Handle("/json", o.Service.JSONHandler())
	if o.Metrics != nil {
		mux.Handle("/metrics", o.Metrics)
	}
	httpSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	metricsSrv := &http.Server{ReadHeaderTimeout: 10 * time.Second}
	if o.MetricsAddr != "" {
		mm := http.NewServeMux()
		mm.Handle(o.MetricsPath, o.Metrics)
		metricsSrv.Handler = mm
	}

	dmux := http.NewServeMux()
	dmux.HandleFunc("/debug/pprof/", pprof.Index)
	dmux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	dmux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	dmux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	dmux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	for path, h := range o.Debug {
		dmux.Handle(path, h)
	}
	dmux.Handle("/{$}", debugIndex(o.Debug))
	debugSrv := &http.Server{Handler: dmux, ReadHeaderTimeout: 10 * time.Second}

	errc := make(chan error, 4)
	gl, hl, dl := lis[0], lis[1], lis[2]
	if o.MetricsAddr != "" {
		ml := lis[3]
		go func() { errc <- serveErr("metrics", metricsSrv.Serve(ml)) }()
	}
	lis = nil // the servers own them now
	go func() { errc <- serveErr("gRPC", gs.Serve(gl)) }()
	go func() { errc <- serveErr("HTTP", httpSrv.Serve(hl)) }()
	go func() { errc <- serveErr("debug", debugSrv.Serve(dl)) }()

	stopHealth := make(chan struct{})
	go syncGRPCHealth(o.Health, hs, stopHealth)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	o.Logger.Warn("shutting down")
	o.Health.Stopping()
	close(stopHealth)
	hs.Shutdown()

	sctx, cancel := context.WithTimeout(context.Background(), o.ShutdownTimeout)
	defer cancel()
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-sctx.Done():
		gs.Stop()
	}
	return errors.Join(runErr, httpSrv.Shutdown(sctx), debugSrv.Shutdown(sctx), metricsSrv.Shutdown(sctx))
}

func serveErr(name string, err error) error {
	if err == nil || errors.Is(err, http.ErrServerClosed) || errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return fmt.Errorf("%s server: %w", name, err)
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
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// streamWorkers is how many goroutines serve RPCs and stay between them.
// grpc-go otherwise starts a goroutine per RPC, which grows its stack on
// every call: stack copying was about 10% of the service's CPU under load.
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

// debugIndex lists the debug port's endpoints at "/", as the reference's
// debug port does, so an operator who lands there finds the rest.
func debugIndex(handlers map[string]http.Handler) http.Handler {
	paths := []string{"/debug/pprof/"}
	for p := range handlers {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, strings.Join(paths, "\n")+"\n")
	})
}
