package main

// How main wires metrics, statsd and the gRPC guards' events.

import (
	"context"
	"net/http"

	"github.com/sirupsen/logrus"

	"github.com/openrls/ratelimit/src/metrics"
	"github.com/openrls/ratelimit/src/reload"
	"github.com/openrls/ratelimit/src/service"
	"github.com/openrls/ratelimit/src/settings"
	"github.com/openrls/ratelimit/src/topk"
)

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

// debugHandlers are the debug port's own endpoints, and the /limited
// sketch the service feeds (nil when TOP_LIMITED_SIZE=0).
func debugHandlers(s settings.Settings, reg *metrics.Registry, configs *reload.Holder) (map[string]http.Handler, service.Limited) {
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
