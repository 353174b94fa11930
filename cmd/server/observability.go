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

// prometheusHandler is what PROMETHEUS_ADDR serves, unless DISABLE_STATS:
// the user's statsd_exporter mapping (PROMETHEUS_MAPPER_YAML), fed until
// ctx ends, or else the reference's default series beside this service's.
func prometheusHandler(ctx context.Context, s settings.Settings, reg *metrics.Registry) (http.Handler, error) {
	if !s.UsePrometheus || s.DisableStats {
		return nil, nil
	}
	if s.PrometheusMapperYAML == "" {
		return reg.ReferenceHandler(), nil
	}
	m, err := metrics.NewMapped(s.PrometheusMapperYAML)
	if err != nil {
		return nil, err
	}
	go reg.RunMapped(ctx, m, s.StatsFlushInterval, s.Tags())
	return m.Handler(), nil
}

func prometheusAddr(s settings.Settings) string {
	if s.UsePrometheus {
		return s.PrometheusAddr
	}
	return ""
}

// newRegistry builds the metrics registry and, unless stats are off,
// starts the collector's sink (statsd or DogStatsD), and returns what
// PROMETHEUS_ADDR serves (nil: nothing).
func newRegistry(ctx context.Context, s settings.Settings, log logrus.FieldLogger) (*metrics.Registry, http.Handler, error) {
	reg := metrics.New(s.MetricsOptions())
	reg.GoRuntimeStats()
	switch {
	case s.DisableStats:
	case s.UseDogStatsd:
		go runDogStatsd(ctx, s, reg, log)
	case s.UseStatsd:
		go runStatsd(ctx, s, reg, log)
	}
	h, err := prometheusHandler(ctx, s, reg)
	return reg, h, err
}

// runDogStatsd sends DogStatsD until ctx ends.
func runDogStatsd(ctx context.Context, s settings.Settings, reg *metrics.Registry, log logrus.FieldLogger) {
	opts := s.DogStatsdOptions()
	if err := reg.RunDogStatsd(ctx, opts); err != nil {
		log.WithError(err).WithField("dogstatsd", opts.Addr).Error("dogstatsd disabled")
	}
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
