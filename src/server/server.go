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
	"io/fs"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/openrls/ratelimit/src/server/h2guard"
)

// Service is what the gRPC listener serves.
type Service interface {
	rlsv3.RateLimitServiceServer
}

// Options configures Run.
type Options struct {
	GRPCAddr, HTTPAddr, DebugAddr string
	// GRPCUnixSocket, when set, serves gRPC on this Unix socket path
	// instead of GRPCAddr (GRPC_UDS).
	GRPCUnixSocket string
	Service        Service
	// Quota, when not nil, serves the Rate Limit Quota Service (RLQS) on
	// the same gRPC listener.
	Quota rlqsv3.RateLimitQuotaServiceServer
	// JSON serves POST /json on the HTTP port; nil leaves it unmounted.
	JSON   http.Handler
	Health *Health
	// Debug handlers mounted on the debug port beside /debug/pprof/,
	// e.g. "/rlconfig".
	Debug map[string]http.Handler
	// Metrics is served at /metrics on the HTTP port and, when MetricsAddr
	// is set, at MetricsPath on a listener of its own (USE_PROMETHEUS).
	Metrics                  http.Handler
	MetricsAddr, MetricsPath string
	// MetricsAddrHandler, when set, is served on MetricsAddr instead of
	// Metrics (the reference's series, for USE_PROMETHEUS).
	MetricsAddrHandler http.Handler
	// TLS, when not nil, serves gRPC over TLS (see NewTLSConfig).
	TLS *tls.Config
	// GRPCOptions are extra gRPC server options (tracing's stats handler).
	GRPCOptions           []grpc.ServerOption
	MaxConnectionAge      time.Duration
	MaxConnectionAgeGrace time.Duration
	// MaxRequestBytes bounds one gRPC request message (REQUEST_MAX_BYTES);
	// a larger one is refused from its length prefix, before its body is
	// buffered. 0 means DefaultMaxRequestBytes.
	MaxRequestBytes int
	// MaxRequestBytesInFlight bounds the bytes of large requests being
	// handled at once (GRPC_MAX_REQUEST_BYTES_IN_FLIGHT, see byteBudget);
	// 0 means DefaultMaxRequestBytesInFlight.
	MaxRequestBytesInFlight int
	// MaxConcurrentStreams bounds the calls in flight on one connection
	// (GRPC_MAX_CONCURRENT_STREAMS); 0 means DefaultMaxConcurrentStreams.
	MaxConcurrentStreams uint32
	// MaxConnectionIdle closes a gRPC connection without calls for this
	// long (GRPC_MAX_CONNECTION_IDLE); 0 never.
	MaxConnectionIdle time.Duration
	// Guard bounds what one client may take of the gRPC listener (see
	// h2guard.Options); OnGuard, when set, hears each time a guard acts.
	Guard   h2guard.Options
	OnGuard func(h2guard.Event)
	// HTTPLimits caps each HTTP listener's connections; OnHTTPConn, when
	// set, hears each connection a listener closes of its own accord
	// (port: http, debug or metrics; why: HTTPRefused or HTTPEvictedIdle).
	HTTPLimits HTTPLimits
	OnHTTPConn func(port, why string)
	// Timeouts bounds slow or silent clients; zero fields take
	// DefaultTimeouts' values.
	Timeouts Timeouts
	// ShutdownTimeout is the grace in-flight calls and connections get
	// once shutdown begins; what is still open then is closed. 0 means 10s.
	ShutdownTimeout time.Duration
	Logger          logrus.FieldLogger
}

// Defaults of the request bounds.
const (
	// DefaultMaxRequestBytes is far above what Envoy can put in a request
	// (its default header limit is 60 KiB, and descriptors are made from
	// headers) and small enough that many concurrent requests stay cheap.
	DefaultMaxRequestBytes = 256 << 10
	// DefaultMaxRequestBytesInFlight lets 256 requests of the default
	// REQUEST_MAX_BYTES be handled at once (each costs a few times its
	// size); Envoy's, under a kilobyte, are not counted (see byteBudget).
	DefaultMaxRequestBytesInFlight = 64 << 20
	// DefaultMaxConcurrentStreams is per connection; Envoy opens another
	// connection when one is full.
	DefaultMaxConcurrentStreams = 1000
)

// Timeouts bound what a client may hold open without progress.
type Timeouts struct {
	// Handshake bounds a new gRPC connection's TLS handshake and HTTP/2
	// preface: a connection that sends nothing is closed after it.
	Handshake time.Duration
	// KeepaliveTime is how long a gRPC connection may be silent before the
	// server pings it; KeepaliveTimeout how long it then waits for the
	// answer before closing it (a peer that vanished).
	KeepaliveTime, KeepaliveTimeout time.Duration
	// ReadHeader and Read bound reading an HTTP request's headers and the
	// whole request; Write bounds writing the answer (not on the debug
	// port, where a CPU profile takes as long as it was asked to); Idle
	// bounds a kept-alive HTTP connection between requests.
	ReadHeader, Read, Write, Idle time.Duration
}

// defaultTimeouts are the service's: generous for any real client on a
// loaded machine, short enough that silent connections do not pile up.
var defaultTimeouts = Timeouts{
	Handshake:        10 * time.Second,
	KeepaliveTime:    time.Minute,
	KeepaliveTimeout: 20 * time.Second,
	ReadHeader:       10 * time.Second,
	Read:             30 * time.Second,
	Write:            30 * time.Second,
	Idle:             2 * time.Minute,
}

func (t Timeouts) withDefaults() Timeouts {
	for _, f := range []struct {
		v *time.Duration
		d time.Duration
	}{
		{&t.Handshake, defaultTimeouts.Handshake}, {&t.KeepaliveTime, defaultTimeouts.KeepaliveTime},
		{&t.KeepaliveTimeout, defaultTimeouts.KeepaliveTimeout}, {&t.ReadHeader, defaultTimeouts.ReadHeader},
		{&t.Read, defaultTimeouts.Read}, {&t.Write, defaultTimeouts.Write}, {&t.Idle, defaultTimeouts.Idle},
	} {
		if *f.v <= 0 {
			*f.v = f.d
		}
	}
	return t
}

// Run listens on every address and serves until ctx is done.
func Run(ctx context.Context, o Options) error {
	o = o.withDefaults()
	if limit := openFileLimit(); limit > 0 {
		fitDescriptors(&o, limit, o.Logger)
	}
	lis, err := listen(o)
	if err != nil {
		return err
	}
	capped := map[int]*capListener{}
	for i, port := range map[int]string{1: "http", 2: "debug", 3: "metrics"} {
		if i < len(lis) {
			capped[i] = newCapListener(lis[i], o.HTTPLimits, func(why string) { o.OnHTTPConn(port, why) })
			lis[i] = capped[i]
		}
	}
	// The guards watch HTTP/2 as it is accepted when it is plaintext, and
	// after the handshake under TLS (gl.Creds).
	gl := h2guard.NewListener(lis[0], o.Guard, o.TLS == nil, o.OnGuard)
	lis[0] = gl
	gs := grpc.NewServer(grpcOptions(o, gl)...)
	rlsv3.RegisterRateLimitServiceServer(gs, o.Service)
	if o.Quota != nil {
		rlqsv3.RegisterRateLimitQuotaServiceServer(gs, o.Quota)
	}
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	httpSrv, debugSrv, metricsSrv := httpServers(o)
	for i, srv := range map[int]*http.Server{1: httpSrv, 2: debugSrv, 3: metricsSrv} {
		if cl := capped[i]; cl != nil {
			srv.ConnState = cl.connState
		}
	}

	errc := make(chan error, 4)
	if o.MetricsAddr != "" {
		go func() { errc <- serveErr("metrics", metricsSrv.Serve(lis[3])) }()
	}
	go func() { errc <- serveErr("gRPC", gs.Serve(lis[0])) }()
	go func() { errc <- serveErr("HTTP", httpSrv.Serve(lis[1])) }()
	go func() { errc <- serveErr("debug", debugSrv.Serve(lis[2])) }()

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
	shutdown(o, gs, httpSrv, debugSrv, metricsSrv)
	return runErr
}

// withDefaults fills in the zero fields.
func (o Options) withDefaults() Options {
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = 10 * time.Second
	}
	if o.MaxRequestBytes <= 0 {
		o.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if o.MaxConcurrentStreams == 0 {
		o.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if o.MaxRequestBytesInFlight <= 0 {
		o.MaxRequestBytesInFlight = DefaultMaxRequestBytesInFlight
	}
	o.Timeouts = o.Timeouts.withDefaults()
	if o.Guard.Bytes == nil {
		o.Guard.Bytes = h2guard.NewBudget(int64(o.MaxRequestBytesInFlight))
	}
	o.Guard = o.Guard.WithDefaults()
	if o.OnGuard == nil {
		o.OnGuard = func(h2guard.Event) {}
	}
	o.HTTPLimits = o.HTTPLimits.withDefaults()
	if o.OnHTTPConn == nil {
		o.OnHTTPConn = func(string, string) {}
	}
	if o.Logger == nil {
		o.Logger = logrus.StandardLogger()
	}
	return o
}

// listen opens the gRPC (TCP or Unix socket), HTTP and debug listeners,
// and the metrics one when asked, in that order; on an error none stays
// open.
func listen(o Options) ([]net.Listener, error) {
	// settings names what sets each address, for the error a user fixes.
	type addr struct{ name, network, addr, settings string }
	addrs := []addr{{"gRPC", "tcp", o.GRPCAddr, "GRPC_HOST and GRPC_PORT"}, {"HTTP", "tcp", o.HTTPAddr, "HOST and PORT"},
		{"debug", "tcp", o.DebugAddr, "DEBUG_HOST and DEBUG_PORT"}}
	if o.GRPCUnixSocket != "" {
		if err := removeStaleSocket(o.GRPCUnixSocket); err != nil {
			return nil, err
		}
		addrs[0] = addr{"gRPC", "unix", o.GRPCUnixSocket, "GRPC_UDS"}
	}
	if o.MetricsAddr != "" {
		addrs = append(addrs, addr{"metrics", "tcp", o.MetricsAddr, "PROMETHEUS_ADDR"})
	}
	lis := make([]net.Listener, 0, len(addrs))
	for _, a := range addrs {
		l, err := net.Listen(a.network, a.addr)
		if err != nil {
			for _, l := range lis {
				_ = l.Close()
			}
			return nil, fmt.Errorf("listen for %s on %s (set by %s): %w", a.name, a.addr, a.settings, err)
		}
		lis = append(lis, l)
		o.Logger.Infof("listening for %s on %s", a.name, l.Addr())
	}
	return lis, nil
}

// httpServers builds the HTTP port's server (/healthcheck, /json,
// /metrics), the debug port's (pprof, an index, o.Debug) and the metrics
// listener's (USE_PROMETHEUS; unused without MetricsAddr).
func httpServers(o Options) (httpSrv, debugSrv, metricsSrv *http.Server) {
	mux := http.NewServeMux()
	mux.Handle("/healthcheck", o.Health)
	if o.JSON != nil {
		mux.Handle("/json", o.JSON)
	}
	if o.Metrics != nil {
		mux.Handle("/metrics", o.Metrics)
	}
	httpSrv = httpServer(mux, o.Timeouts, true)
	metricsSrv = httpServer(nil, o.Timeouts, true)
	if o.MetricsAddr != "" {
		mm := http.NewServeMux()
		h := o.Metrics
		if o.MetricsAddrHandler != nil {
			h = o.MetricsAddrHandler
		}
		mm.Handle(o.MetricsPath, h)
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
	debugSrv = httpServer(dmux, o.Timeouts, false)
	return httpSrv, debugSrv, metricsSrv
}

// shutdown drains every server in parallel within o.ShutdownTimeout, then
// closes what is still open, and says so.
func shutdown(o Options, gs *grpc.Server, servers ...*http.Server) {
	sctx, cancel := context.WithTimeout(context.Background(), o.ShutdownTimeout)
	defer cancel()
	var wg sync.WaitGroup
	var forced atomic.Int32
	wg.Add(1)
	go func() {
		defer wg.Done()
		done := make(chan struct{})
		go func() { gs.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-sctx.Done():
			gs.Stop()
			forced.Add(1)
		}
	}()
	for _, srv := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if srv.Shutdown(sctx) != nil {
				_ = srv.Close()
				forced.Add(1)
			}
		}()
	}
	wg.Wait()
	if forced.Load() > 0 {
		// A stuck client must not turn a requested stop into a failure.
		o.Logger.Warnf("closed the connections still open after the %v shutdown grace", o.ShutdownTimeout)
	}
}

// removeStaleSocket removes a socket file left by a process that did not
// exit cleanly, which would otherwise fail the listen with "address already
// in use". Anything else at the path is left alone and reported.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("GRPC_UDS %s: %w", path, err)
	case fi.Mode()&fs.ModeSocket == 0:
		return fmt.Errorf("GRPC_UDS %s: exists and is not a socket", path)
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return fmt.Errorf("GRPC_UDS %s: another process is listening on it", path)
	}
	return os.Remove(path)
}

// httpServer bounds how long a client may take to send a request and
// idle between requests, so slow or silent clients cannot hold
// connections (and shutdown) indefinitely.
func httpServer(h http.Handler, t Timeouts, boundWrites bool) *http.Server {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: t.ReadHeader, ReadTimeout: t.Read, IdleTimeout: t.Idle,
		MaxHeaderBytes: 64 << 10}
	if boundWrites {
		srv.WriteTimeout = t.Write
	}
	return srv
}

func serveErr(name string, err error) error {
	if err == nil || errors.Is(err, http.ErrServerClosed) || errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return fmt.Errorf("%s server: %w", name, err)
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
