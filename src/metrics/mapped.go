package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/statsd_exporter/pkg/event"
	"github.com/prometheus/statsd_exporter/pkg/exporter"
	"github.com/prometheus/statsd_exporter/pkg/mapper"

	"github.com/openrls/ratelimit/src/regularfile"
)

// Mapped is PROMETHEUS_ADDR's registry under a user's statsd_exporter
// mapping (PROMETHEUS_MAPPER_YAML), as envoyproxy/ratelimit builds it:
// every statsd name this service sends (counter deltas and gauges each
// flush, every response time as an observation) goes through the
// statsd_exporter library's own mapper and exporter, so that every
// feature of that format (glob and regex matches, labels,
// match_metric_type, action: drop, histograms and summaries, defaults)
// reads as the exporter reads it. Names no mapping line takes get the
// exporter's default names.
type Mapped struct {
	reg    *prometheus.Registry
	mapper *mapper.MetricMapper
	exp    *exporter.Exporter
	events chan event.Events
	// batch is the flush being built, sent as one Events by send; only
	// the flusher's goroutine touches it.
	batch event.Events
	// suffix is EXTRA_TAGS as the reference's stats library writes them
	// into every name (".__k=v"), which is what its mappings match.
	suffix string
}

// maxMappingBytes bounds a mapping file: a thousand mappings are a few
// hundred KB, and a path pointed at a device must not be read without end.
const maxMappingBytes = 4 << 20

// NewMapped reads the mapping file and builds the registry it feeds. An
// error names the file and, for YAML, the line.
func NewMapped(file string) (*Mapped, error) {
	src, err := regularfile.Read(file, maxMappingBytes)
	if err != nil {
		return nil, fmt.Errorf("PROMETHEUS_MAPPER_YAML: %w", err)
	}
	m := &Mapped{reg: prometheus.NewRegistry(), events: make(chan event.Events, 64)}
	m.mapper = &mapper.MetricMapper{Registerer: m.reg, Logger: slog.New(slog.DiscardHandler)}
	if err := m.mapper.InitFromYAMLString(string(src)); err != nil {
		return nil, fmt.Errorf("PROMETHEUS_MAPPER_YAML: %s: %w", file, err)
	}
	// The exporter's own counters, named and helped as statsd_exporter
	// (and the reference) serve them.
	actions := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "statsd_exporter_events_actions_total",
		Help: "The total number of StatsD events by action."}, []string{"action"})
	unmapped := prometheus.NewCounter(prometheus.CounterOpts{Name: "statsd_exporter_events_unmapped_total",
		Help: "The total number of StatsD events no mapping was found for."})
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "statsd_exporter_events_error_total",
		Help: "The total number of StatsD events discarded due to errors."}, []string{"reason"})
	events := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "statsd_exporter_events_total",
		Help: "The total number of StatsD events seen."}, []string{"type"})
	conflicts := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "statsd_exporter_events_conflict_total",
		Help: "The total number of StatsD events with conflicting names."}, []string{"type"})
	count := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "statsd_exporter_metrics_total",
		Help: "The total number of metrics."}, []string{"type"})
	m.reg.MustRegister(actions, unmapped, errs, events, conflicts, count,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.exp = exporter.NewExporter(m.reg, m.mapper, slog.New(slog.DiscardHandler), actions, unmapped, errs, events, conflicts, count)
	return m, nil
}

// Handler serves the mapped series.
func (m *Mapped) Handler() http.Handler { return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}) }

func (m *Mapped) counter(name string, delta uint64) {
	m.add(&event.CounterEvent{CMetricName: name + m.suffix, CValue: float64(delta), CLabels: map[string]string{}})
}

func (m *Mapped) gauge(name string, value uint64) {
	m.add(&event.GaugeEvent{GMetricName: name + m.suffix, GValue: float64(value), GLabels: map[string]string{}})
}

// timer observes milliseconds, as the reference's sink hands its timer to
// the exporter (a mapping's scale: 0.001 makes seconds of it).
func (m *Mapped) timer(name string, d time.Duration) {
	m.add(&event.ObserverEvent{OMetricName: name + m.suffix, OValue: float64(d) / float64(time.Millisecond), OLabels: map[string]string{}})
}

func (m *Mapped) add(e event.Event) { m.batch = append(m.batch, e) }

// send hands the flush to the exporter's loop; it never fails.
func (m *Mapped) send() error {
	b := m.batch
	m.batch = nil
	if len(b) > 0 {
		m.events <- b
	}
	return nil
}

// RunMapped feeds m until ctx ends, flushing counters every interval
// (0: 10s) and response times every second, as RunStatsd does; tags
// (EXTRA_TAGS) end every name as ".__k=v", as in the names the
// reference's sink hands the same library.
func (r *Registry) RunMapped(ctx context.Context, m *Mapped, interval time.Duration, tags map[string]string) {
	m.suffix = tagSuffix(tags)
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.exp.Listen(m.events)
	}()
	r.runFlusher(ctx, interval, m, nil, nil)
	close(m.events)
	<-done
}
