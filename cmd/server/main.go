// Command server is the rate limit service. It only wires packages together:
// settings → logger → store → config → service → listeners.
package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"

	"github.com/openrls/ratelimit/src/buildinfo"
	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/memtrim"
	"github.com/openrls/ratelimit/src/metrics"
	"github.com/openrls/ratelimit/src/reload"
	"github.com/openrls/ratelimit/src/rlqs"
	"github.com/openrls/ratelimit/src/server"
	"github.com/openrls/ratelimit/src/service"
	"github.com/openrls/ratelimit/src/settings"
	"github.com/openrls/ratelimit/src/stores"
	"github.com/openrls/ratelimit/src/tracing"
)

// defaultGCPercent trades memory for CPU: the service's live heap is small
// and short-lived garbage is most of what it makes, so collecting less often
// measurably raises throughput and lowers tail latency (docs/performance.md).
// GOGC, when set, wins.
const defaultGCPercent = 400

func main() {
	if code, stop := commandLine(os.Args[1:], os.Stdout, os.Stderr); stop {
		os.Exit(code)
	}
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "ratelimit:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	s, err := settings.Load()
	if err != nil {
		return fmt.Errorf("invalid settings: %w", oneLine(err))
	}
	log := newLogger(s)
	build := buildinfo.Read()
	log.WithFields(logrus.Fields{"version": build.Version, "revision": build.Revision, "go": build.GoVersion}).Info("starting ratelimit")
	_, gomemlimit := os.LookupEnv("GOMEMLIMIT")
	memtrim.Manage(ctx, log, os.DirFS("/"), gomemlimit)
	for _, w := range append(settings.Warnings(), s.Unused()...) {
		log.Warn(w)
	}
	health := &server.Health{}
	reg, promHandler, err := newRegistry(ctx, s, log)
	if err != nil {
		return err
	}
	reg.GaugeFunc("ratelimit_build_info", "1, labelled with the running build's version, VCS revision and Go version.",
		prometheus.Labels{"version": build.Version, "revision": build.Revision, "goversion": build.GoVersion}, func() float64 { return 1 })

	tr, err := tracing.Setup(ctx, s.TracingOptions())
	if err != nil {
		return err
	}
	defer func() { _ = tr.Shutdown(context.Background()) }()

	deps := stores.Deps{Settings: s, Log: log, Health: health, Metrics: reg}
	store, closeStore, err := stores.Open(ctx, deps)
	if err != nil {
		return err
	}
	defer closeStore()

	configs, err := startConfig(ctx, s, log, health)
	if err != nil {
		return err
	}
	configs.ExportMetrics(reg, strings.EqualFold(s.ConfigType, "FILE"))

	fallback := stores.OpenFallback(deps)
	defer fallback.Close()
	debug, limited := debugHandlers(s, reg, configs)
	svc, err := service.New(serviceOptions(s, tr.Store(store), fallback, configs, reg, limited, log))
	if err != nil {
		return err
	}
	tlsCfg, err := grpcTLS(s, log, reg)
	if err != nil {
		return err
	}
	o := serverOptions(s, svc, tlsCfg, health, debug, reg, tr.ServerOptions(), log)
	o.MetricsAddrHandler = promHandler
	if s.RLQSEnabled {
		o.Quota = startQuota(ctx, s, tr.Store(store), configs, reg, debug, log)
	}
	return server.Run(ctx, o)
}

// startQuota builds the Rate Limit Quota Service on the RLS store and
// config, and runs its renewals until ctx is done.
func startQuota(ctx context.Context, s settings.Settings, store limiter.Store, configs *reload.Holder,
	reg *metrics.Registry, debug map[string]http.Handler, log logrus.FieldLogger) *rlqs.Service {
	o := s.RLQSOptions()
	o.Store, o.Configs, o.Logger, o.Clock = store, configs, log, processClock
	q := rlqs.New(o)
	for _, c := range q.Collectors() {
		reg.MustRegister(c)
	}
	debug["/rlqs"] = q.DebugHandler()
	go q.Run(ctx)
	return q
}

// grpcTLS builds the gRPC server's TLS config, if TLS is on. A rotation to
// files that do not load keeps the previous certificate serving, and is
// logged and counted.
func grpcTLS(s settings.Settings, log logrus.FieldLogger, reg *metrics.Registry) (*tls.Config, error) {
	if !s.GRPCServerUseTLS {
		return nil, nil
	}
	var failed atomic.Uint64
	reg.CounterFunc("ratelimit_tls_certificate_reload_errors_total",
		"Changes to the gRPC server's certificate files that did not load; the previous certificate kept serving.", nil,
		func() float64 { return float64(failed.Load()) })
	opts := s.GRPCTLSOptions()
	opts.OnReloadError = func(err error) {
		failed.Add(1)
		log.WithError(err).Error("the gRPC TLS files changed but do not load; still serving the previous certificate")
	}
	return server.NewTLSConfig(opts)
}

func newLogger(s settings.Settings) *logrus.Logger {
	log := logrus.New()
	level, _ := logrus.ParseLevel(s.LogLevel) // validated by settings
	log.SetLevel(level)
	if strings.EqualFold(s.LogFormat, "json") {
		log.SetFormatter(&logrus.JSONFormatter{FieldMap: logrus.FieldMap{
			logrus.FieldKeyTime: "@timestamp", logrus.FieldKeyMsg: "@message"}})
	}
	return log
}

// oneLine folds a joined error onto one line for the start-up message.
func oneLine(err error) error {
	return fmt.Errorf("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
}

// processClock is the one clock the wiring hands out (docs/stores.md):
// the quota service names its windows by it and, with
// RLQS_SHARED_COUNTERS, so does the RLS handler, so that both name the
// same window. Otherwise each store counts by its own clock (Redis's
// TIME), which the handler leaves it by passing none.
func processClock() time.Time { return time.Now() }

// serviceOptions projects the settings onto the RLS handler's options.
func serviceOptions(s settings.Settings, store limiter.Store, fallback limiter.Store, configs *reload.Holder, reg *metrics.Registry,
	limited service.Limited, log logrus.FieldLogger) service.Options {
	o := s.ServiceOptions()
	o.Store, o.Fallback, o.Configs = store, fallback, configs
	if o.SharedWindows {
		o.Now = processClock
	}
	o.Metrics, o.Limited, o.Logger = reg, limited, log
	return o
}

// serverOptions projects the settings onto the listeners' options.
func serverOptions(s settings.Settings, svc *service.Server, tlsCfg *tls.Config, health *server.Health, debug map[string]http.Handler,
	reg *metrics.Registry, grpcOpts []grpc.ServerOption, log logrus.FieldLogger) server.Options {
	o := s.ServerOptions()
	o.TLS, o.Service, o.JSON, o.Health, o.Debug, o.GRPCOptions = tlsCfg, svc, jsonEndpoint(s, svc), health, debug, grpcOpts
	o.OnGuard, o.OnHTTPConn = server.GuardMetrics(reg, log), server.HTTPConnMetrics(reg)
	o.Metrics, o.MetricsAddr = reg.Handler(), prometheusAddr(s)
	o.Logger = log
	return o
}
