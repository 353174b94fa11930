// Command server is the rate limit service. It only wires packages together:
// settings → logger → store → config → service → listeners.
package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/escape"
	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/metrics"
	"github.com/openrls/ratelimit/src/server"
	"github.com/openrls/ratelimit/src/service"
	"github.com/openrls/ratelimit/src/settings"
	"github.com/openrls/ratelimit/src/topk"
	"github.com/openrls/ratelimit/src/tracing"
)

// defaultGCPercent trades memory for CPU: the service's live heap is small
// and short-lived garbage is most of what it makes, so collecting less often
// measurably raises throughput and lowers tail latency (docs/performance.md).
// GOGC, when set, wins.
const defaultGCPercent = 400

func main() {
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
	manageMemory(ctx, log)
	for _, w := range settings.Warnings() {
		log.Warn(w)
	}
	health := &server.Health{}
	var policies []string
	for _, p := range config.FailurePolicies {
		policies = append(policies, string(p))
	}
	reg := metrics.New(metrics.Options{NearLimitRatio: s.NearLimitRatio, MaxDetailedSeries: s.MaxDetailedMetricSeries, FailurePolicies: policies,
		Reference: s.UsePrometheus && !s.DisableStats, ReferenceMillis: s.PrometheusResponseTimeAsMilliseconds})
	if s.UseStatsd && !s.DisableStats {
		go runStatsd(ctx, s, reg, log)
	}

	tr, err := tracing.Setup(ctx, tracing.Options{Enabled: s.TracingEnabled, Protocol: s.TracingExporterProtocol,
		ServiceName: s.TracingServiceName, Namespace: s.TracingServiceNamespace, InstanceID: s.TracingServiceInstanceID,
		SamplingRate: s.TracingSamplingRate})
	if err != nil {
		return err
	}
	defer func() { _ = tr.Shutdown(context.Background()) }()

	store, closeStore, err := newStore(ctx, s, log, health, reg)
	if err != nil {
		return err
	}
	defer closeStore()

	configs, err := startConfig(ctx, s, log, health)
	if err != nil {
		return err
	}
	reg.CounterFunc("ratelimit_config_load_success_total", "Config loads that were served.", nil,
		func() float64 { ok, _ := configs.Counts(); return float64(ok) })
	reg.CounterFunc("ratelimit_config_load_error_total", "Config loads rejected; the last good config kept serving.", nil,
		func() float64 { _, failed := configs.Counts(); return float64(failed) })
	reg.InfoFunc("ratelimit_config_info", "1, labelled with the served config's version (a hash of its rules; /rlconfig shows it).",
		"version", func() string {
			if cfg := configs.Load(); cfg != nil {
				return cfg.Version()
			}
			return ""
		})
	reg.GaugeFunc("ratelimit_config_load_timestamp_seconds", "When the served config was loaded (Unix time; 0 before the first).", nil,
		func() float64 {
			if at := configs.LoadedAt(); !at.IsZero() {
				return float64(at.UnixNano()) / 1e9
			}
			return 0
		})
	reg.StatFunc("ratelimit.service.config_load_success", func() uint64 { ok, _ := configs.Counts(); return ok })
	reg.StatFunc("ratelimit.service.config_load_error", func() uint64 { _, failed := configs.Counts(); return failed })

	fallback := limiter.NewMemoryStore(limiter.MemoryOptions{MaxKeys: s.MemoryMaxKeys, MaxBytes: s.MemoryMaxBytes})
	defer fallback.Close()
	countEvictions(reg, "fallback", fallback)
	debug := map[string]http.Handler{"/rlconfig": rlconfig(configs), "/stats": reg.StatsHandler(), "/explain": explainHandler(configs)}
	var limited service.Limited
	if s.TopLimitedSize > 0 {
		sketch := topk.New(s.TopLimitedSize, s.TopLimitedWindow, nil)
		limited = sketch
		debug["/limited"] = service.LimitedHandler(sketch, s.TopLimitedWindow)
		if s.TopLimitedMetric > 0 {
			reg.MustRegister(service.LimitedCollector(sketch, s.TopLimitedMetric))
		}
	}
	svc, err := service.New(service.Options{
		Store:                      tr.Store(store),
		FailurePolicy:              config.FailurePolicy(s.BackendFailurePolicy),
		Fallback:                   fallback,
		Configs:                    configs,
		ShadowMode:                 s.ShadowMode,
		QuotaMode:                  s.QuotaMode,
		StopIncrementWhenOverLimit: s.StopCacheKeyIncrementWhenOverlimit,
		Headers: service.Headers{Enabled: s.LimitResponseHeadersEnabled, Limit: s.LimitLimitHeader,
			Remaining: s.LimitRemainingHeader, Reset: s.LimitResetHeader},
		DynamicMetadata:      s.ResponseDynamicMetadata,
		DynamicMetadataRules: s.ResponseDynamicMetadataRules,
		Limits: service.Limits{MaxDescriptors: s.RequestMaxDescriptors, MaxEntries: s.RequestMaxEntries,
			MaxStringBytes: s.RequestMaxStringBytes, MaxHits: s.RequestMaxHits, MaxKeys: s.RequestMaxKeys},
		Metrics: reg,
		Limited: limited,
		Logger:  log,
	})
	if err != nil {
		return err
	}
	tlsCfg, err := grpcTLS(s, log, reg)
	if err != nil {
		return err
	}
	return server.Run(ctx, server.Options{
		TLS:                  tlsCfg,
		GRPCAddr:             hostPort(s.GRPCHost, s.GRPCPort),
		GRPCUnixSocket:       s.GRPCUDS,
		HTTPAddr:             hostPort(s.Host, s.Port),
		DebugAddr:            hostPort(s.DebugHost, s.DebugPort),
		Service:              svc,
		JSON:                 jsonEndpoint(s, svc),
		MaxRequestBytes:      s.RequestMaxBytes,
		MaxConcurrentStreams: uint32(s.GRPCMaxConcurrentStreams),
		MaxConnectionIdle:    s.GRPCMaxConnectionIdle,
		Guard: server.GuardOptions{MaxConnections: s.GRPCMaxConnections, MaxConnectionsPerAddress: s.GRPCMaxConnectionsPerAddress,
			MaxInFlight:     s.GRPCMaxCallsInFlight,
			ResetsPerSecond: s.GRPCMaxResetsPerSecond, StreamWriteTimeout: s.GRPCStreamWriteTimeout, Cooldown: cooldown(s)},
		OnGuard:               guardEvents(reg, log),
		Health:                health,
		Debug:                 debug,
		Metrics:               reg.Handler(),
		GRPCOptions:           tr.ServerOptions(),
		MetricsAddr:           prometheusAddr(s),
		MetricsPath:           s.PrometheusPath,
		MetricsAddrHandler:    prometheusHandler(s, reg),
		MaxConnectionAge:      s.GRPCMaxConnectionAge,
		MaxConnectionAgeGrace: s.GRPCMaxConnectionAgeGrace,
		Logger:                log,
	})
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
	return server.NewTLSConfig(server.TLSOptions{CertFile: s.GRPCServerTLSCert, KeyFile: s.GRPCServerTLSKey,
		ClientCAFile: s.GRPCClientTLSCACert, ClientSAN: s.GRPCClientTLSSAN,
		OnReloadError: func(err error) {
			failed.Add(1)
			log.WithError(err).Error("the gRPC TLS files changed but do not load; still serving the previous certificate")
		}})
}

// jsonEndpoint is POST /json, or, when it is off, an answer that says why
// and how to turn it on.
func jsonEndpoint(s settings.Settings, svc *service.Server) http.Handler {
	if s.JSONEndpoint() {
		return svc.JSONHandler()
	}
	reason := "POST /json is off: set JSON_ENDPOINT_ENABLED=true to serve it"
	if s.GRPCClientTLSCACert != "" {
		reason = "POST /json is off while gRPC requires client certificates (GRPC_CLIENT_TLS_CACERT): " +
			"this port checks none; set JSON_ENDPOINT_ENABLED=true to serve it anyway"
	}
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, reason, http.StatusForbidden)
	})
}

// cooldown is GRPC_ABUSE_COOLDOWN as the guard takes it: 0 turns it off.
func cooldown(s settings.Settings) time.Duration {
	if s.GRPCAbuseCooldown == 0 {
		return -1
	}
	return s.GRPCAbuseCooldown
}

// guardEvents counts what the gRPC guards did, by event, and logs a
// connection they closed at most once per event and 10 s (an attacker
// must not flood the log either).
func guardEvents(reg *metrics.Registry, log logrus.FieldLogger) func(server.GuardEvent) {
	events := []server.GuardEvent{server.EventConnectionRefused, server.EventCallRefused, server.EventRapidReset, server.EventUnreadAnswers}
	counts := make(map[server.GuardEvent]*atomic.Uint64, len(events))
	logged := make(map[server.GuardEvent]*atomic.Int64, len(events))
	for _, e := range events {
		counts[e], logged[e] = new(atomic.Uint64), new(atomic.Int64)
		reg.CounterFunc("ratelimit_grpc_guard_total", "gRPC connections closed or refused and calls refused by the listener's guards, by event.",
			prometheus.Labels{"event": string(e)}, func() float64 { return float64(counts[e].Load()) })
	}
	return func(e server.GuardEvent) {
		counts[e].Add(1)
		if e != server.EventRapidReset && e != server.EventUnreadAnswers {
			return
		}
		now := time.Now().UnixNano()
		if last := logged[e].Load(); now-last > int64(10*time.Second) && logged[e].CompareAndSwap(last, now) {
			log.WithField("event", string(e)).Warn("closed a gRPC connection abusing the protocol (counted in ratelimit_grpc_guard_total)")
		}
	}
}

// countEvictions exports how many live counters a memory store dropped
// because it was full (MEMORY_MAX_KEYS, MEMORY_MAX_BYTES), and the bytes
// it holds.
func countEvictions(reg *metrics.Registry, store string, m *limiter.MemoryStore) {
	reg.CounterFunc("ratelimit_memory_evictions_total",
		"Live counters the embedded store dropped to make room (MEMORY_MAX_KEYS, MEMORY_MAX_BYTES); each starts again from zero.",
		prometheus.Labels{"store": store}, func() float64 { return float64(m.Evictions()) })
	reg.GaugeFunc("ratelimit_memory_bytes", "Bytes the embedded store's counters are counted as against MEMORY_MAX_BYTES.",
		prometheus.Labels{"store": store}, func() float64 { return float64(m.Bytes()) })
}

// rlconfig serves the loaded config one line per limit, streamed, or with
// ?summary one line per domain, after a line with its version and load
// time.
func rlconfig(current *config.Holder) http.Handler {
	return withConfig(current, func(w http.ResponseWriter, r *http.Request, cfg *config.Config) {
		fmt.Fprintf(w, "# version %s, loaded %s\n", cfg.Version(), current.LoadedAt().UTC().Format(time.RFC3339))
		if r.URL.Query().Has("summary") {
			_, _ = io.WriteString(w, cfg.Summary())
			return
		}
		_ = cfg.WriteDump(w)
	})
}

// explainHandler serves GET /explain?domain=D&descriptor=k=v,k2=v2 (the
// descriptor parameter repeated for several): how the served config decides
// that request (config.Explain), counting nothing. bin/client -explain asks
// it.
func explainHandler(current *config.Holder) http.Handler {
	return withConfig(current, func(w http.ResponseWriter, r *http.Request, cfg *config.Config) {
		q := r.URL.Query()
		req := &rlsv3.RateLimitRequest{Domain: q.Get("domain")}
		for _, d := range q["descriptor"] {
			desc, err := config.ParseDescriptor(d)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			req.Descriptors = append(req.Descriptors, desc)
		}
		if req.Domain == "" || len(req.Descriptors) == 0 {
			http.Error(w, "want ?domain=D&descriptor=k=v[,k2=v2] (descriptor repeated for several)", http.StatusBadRequest)
			return
		}
		escape.Request(req) // as the gRPC codec does, so values match as they would there
		fmt.Fprintf(w, "# config version %s\n", cfg.Version())
		if err := cfg.Explain(w, req.Domain, req.Descriptors); err != nil {
			fmt.Fprintln(w, "error:", err)
		}
	})
}

// withConfig serves plain text from the config being served, or 503
// before one is.
func withConfig(current *config.Holder, serve func(http.ResponseWriter, *http.Request, *config.Config)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		cfg := current.Load()
		if cfg == nil {
			http.Error(w, "no config loaded", http.StatusServiceUnavailable)
			return
		}
		serve(w, r, cfg)
	})
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

// runStatsd sends statsd until ctx ends, reporting an unreachable
// collector once per outage.
func runStatsd(ctx context.Context, s settings.Settings, reg *metrics.Registry, log logrus.FieldLogger) {
	addr := hostPort(s.StatsdHost, s.StatsdPort)
	slog := log.WithFields(logrus.Fields{"statsd": addr, "protocol": s.StatsdProtocol})
	reg.CounterFunc("ratelimit_statsd_dropped_timings_total",
		"Response times not sent to statsd because its buffer was full (a slow or absent collector).", nil,
		func() float64 { return float64(reg.StatsdDropped()) })
	err := reg.RunStatsd(ctx, metrics.StatsdOptions{Network: s.StatsdProtocol, Addr: addr, Interval: s.StatsFlushInterval, Tags: s.Tags(),
		OnError: func(err error) {
			slog.WithError(err).Warn("statsd collector unreachable; counts are kept and sent when it answers")
		},
		OnRecover: func() { slog.Info("statsd collector reachable again") }})
	if err != nil {
		slog.WithError(err).Error("statsd disabled")
	}
}

// prometheusHandler is what PROMETHEUS_ADDR serves: the reference's series
// beside this service's, unless DISABLE_STATS.
func prometheusHandler(s settings.Settings, reg *metrics.Registry) http.Handler {
	if !s.UsePrometheus || s.DisableStats {
		return nil
	}
	return reg.ReferenceHandler()
}

func prometheusAddr(s settings.Settings) string {
	if s.UsePrometheus {
		return s.PrometheusAddr
	}
	return ""
}

func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

// oneLine folds a joined error onto one line for the start-up message.
func oneLine(err error) error {
	return fmt.Errorf("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
}
