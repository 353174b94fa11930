package main

// How main wires metrics, statsd and the gRPC guards' events.

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/logthrottle"
	"github.com/openrls/ratelimit/src/metrics"
	"github.com/openrls/ratelimit/src/server"
	"github.com/openrls/ratelimit/src/server/h2guard"
	"github.com/openrls/ratelimit/src/service"
	"github.com/openrls/ratelimit/src/settings"
	"github.com/openrls/ratelimit/src/topk"
)

// guardEvents counts what the gRPC guards did, by event, and logs a
// connection they closed for abuse at most once per event and 10 s, with
// how many were held back (an attacker must not flood the log either).
func guardEvents(reg *metrics.Registry, log logrus.FieldLogger) func(h2guard.Event) {
	events := []h2guard.Event{h2guard.EventConnectionRefused, h2guard.EventCallRefused, h2guard.EventRapidReset, h2guard.EventUnreadAnswers,
		h2guard.EventProbationReplaced, h2guard.EventConnectionHeld, h2guard.EventResetInLine}
	counts := make(map[h2guard.Event]*atomic.Uint64, len(events))
	for _, e := range events {
		counts[e] = new(atomic.Uint64)
		reg.CounterFunc("ratelimit_grpc_guard_total", "gRPC connections closed, refused or held in line and calls refused by the listener's guards, by event.",
			prometheus.Labels{"event": string(e)}, func() float64 { return float64(counts[e].Load()) })
	}
	logged := map[h2guard.Event]*logthrottle.Throttle{}
	for _, e := range []h2guard.Event{h2guard.EventRapidReset, h2guard.EventUnreadAnswers, h2guard.EventResetInLine} {
		logged[e] = &logthrottle.Throttle{Every: 10 * time.Second}
	}
	return func(e h2guard.Event) {
		counts[e].Add(1)
		if th := logged[e]; th != nil {
			if n, ok := th.Due(time.Now()); ok {
				log.WithField("event", string(e)).WithField("suppressed", n).
					Warn("closed a gRPC connection abusing the protocol (counted in ratelimit_grpc_guard_total)")
			}
		}
	}
}

// httpConnEvents counts the connections the HTTP listeners close of their
// own accord, by port and why.
func httpConnEvents(reg *metrics.Registry) func(port, why string) {
	type key struct{ port, why string }
	counts := map[key]*atomic.Uint64{}
	for _, port := range []string{"http", "debug", "metrics"} {
		for _, why := range []string{server.HTTPRefused, server.HTTPEvictedIdle} {
			n := new(atomic.Uint64)
			counts[key{port, why}] = n
			reg.CounterFunc("ratelimit_http_connections_closed_total",
				"Connections an HTTP listener closed at its caps (HTTP_MAX_CONNECTIONS, _PER_ADDRESS): refused while every "+
					"connection was busy, or idle keep-alive ones evicted for a new one.",
				prometheus.Labels{"port": port, "why": why}, func() float64 { return float64(n.Load()) })
		}
	}
	return func(port, why string) {
		if n := counts[key{port, why}]; n != nil {
			n.Add(1)
		}
	}
}

// countFull exports how many live counters a memory store dropped
// because it was full (MEMORY_MAX_KEYS, MEMORY_MAX_BYTES), and the bytes
// it holds.
func countFull(reg *metrics.Registry, store string, m *limiter.MemoryStore) {
	reg.CounterFunc("ratelimit_memory_full_total",
		"Calls the embedded store refused for want of room for a new counter, every counter it holds being live "+
			"(MEMORY_MAX_KEYS, MEMORY_MAX_BYTES); they were answered by failure policy.",
		prometheus.Labels{"store": store}, func() float64 { return float64(m.Refused()) })
	reg.GaugeFunc("ratelimit_memory_bytes", "Bytes the embedded store's counters are counted as against MEMORY_MAX_BYTES.",
		prometheus.Labels{"store": store}, func() float64 { return float64(m.Bytes()) })
}

// runStatsd sends statsd until ctx ends, reporting an unreachable
// collector once per outage.
func runStatsd(ctx context.Context, s settings.Settings, reg *metrics.Registry, log logrus.FieldLogger) {
	opts := s.StatsdOptions()
	slog := log.WithFields(logrus.Fields{"statsd": opts.Addr, "protocol": opts.Network})
	reg.CounterFunc("ratelimit_statsd_dropped_timings_total",
		"Response times not sent to statsd because its buffer was full (a slow or absent collector).", nil,
		func() float64 { return float64(reg.StatsdDropped()) })
	opts.OnError = func(err error) {
		slog.WithError(err).Warn("statsd collector unreachable; counts are kept and sent when it answers")
	}
	opts.OnRecover = func() { slog.Info("statsd collector reachable again") }
	if err := reg.RunStatsd(ctx, opts); err != nil {
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

// newRegistry builds the metrics registry and, unless it is off, starts
// statsd.
func newRegistry(ctx context.Context, s settings.Settings, log logrus.FieldLogger) *metrics.Registry {
	reg := metrics.New(s.MetricsOptions())
	reg.GoRuntimeStats()
	if s.UseStatsd && !s.DisableStats {
		go runStatsd(ctx, s, reg, log)
	}
	return reg
}

// exportConfigMetrics exports the config loads and the served config's
// version and load time; from files, also as the reference's runtime
// loader counts them (runtime.load_attempts, runtime.num_values: the files
// of the served config).
func exportConfigMetrics(reg *metrics.Registry, configs *config.Holder, fromFiles bool) {
	if fromFiles {
		reg.StatFunc("runtime.load_attempts", func() uint64 { ok, failed := configs.Counts(); return ok + failed })
		reg.GaugeStatFunc("runtime.num_values", func() uint64 {
			cfg := configs.Load()
			var n uint64
			for _, d := range cfg.Domains() {
				n += uint64(len(cfg.Domain(d).Files))
			}
			return n
		})
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
}

// debugHandlers are the debug port's own endpoints, and the /limited
// sketch the service feeds (nil when TOP_LIMITED_SIZE=0).
func debugHandlers(s settings.Settings, reg *metrics.Registry, configs *config.Holder) (map[string]http.Handler, service.Limited) {
	debug := map[string]http.Handler{"/rlconfig": rlconfig(configs), "/stats": reg.StatsHandler(), "/explain": explainHandler(configs)}
	if s.TopLimitedSize == 0 {
		return debug, nil
	}
	sketch := topk.New(s.TopLimitedSize, s.TopLimitedWindow, nil)
	debug["/limited"] = service.LimitedHandler(sketch, s.TopLimitedWindow)
	if s.TopLimitedMetric > 0 {
		reg.MustRegister(service.LimitedCollector(sketch, s.TopLimitedMetric, s.TopLimitedWindow, nil))
	}
	return debug, sketch
}
