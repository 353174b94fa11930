package rlqs

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// stats are the service's own series; Collectors hands them to a registry.
type stats struct {
	assignments *prometheus.CounterVec
	reported    *prometheus.CounterVec
	anomalies   *prometheus.CounterVec
	refused     *prometheus.CounterVec
	shadow      prometheus.Counter
	abandoned   prometheus.Counter
	storeErrors prometheus.Counter
	shortfalls  prometheus.Counter
	dropped     prometheus.Counter
	stalled     prometheus.Counter
	panics      prometheus.Counter
}

func newStats() *stats {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	v := func(name, help, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})
	}
	return &stats{
		assignments: v("ratelimit_rlqs_assignments_total", "RLQS bucket actions sent, by kind (token_bucket, allow_all, unmatched, shadow, deny_all, abandon).", "kind"),
		reported:    v("ratelimit_rlqs_reported_requests_total", "Requests Envoys reported through RLQS, by result (allowed, denied).", "result"),
		anomalies:   v("ratelimit_rlqs_report_anomalies_total", "RLQS reports taken although they break the API's rules, by kind (empty_report, empty_bucket_id, domain_changed), idle reports of a bucket just abandoned, skipped as stale (report_after_abandon), and reports past a stream's pace, held for its next (report_held) or dropped past RLQS_MAX_BUCKETS_PER_STREAM usages held (report_dropped).", "kind"),
		refused:     v("ratelimit_rlqs_refused_total", "RLQS streams and buckets refused at a bound, by what (streams, buckets, total_buckets, bucket_id_entries, bucket_id_size, bucket_id_bytes, total_bucket_id_bytes), and streams ended for reporting more than twice RLQS_MAX_BUCKETS_PER_STREAM bucket usages in a second (report_rate).", "what"),
		shadow:      c("ratelimit_rlqs_shadow_requests_total", "Requests reported on buckets whose rule is in shadow or quota mode (answered ALLOW_ALL)."),
		abandoned:   c("ratelimit_rlqs_abandoned_buckets_total", "RLQS buckets abandoned after reporting no requests for RLQS_IDLE_ABANDON."),
		storeErrors: c("ratelimit_rlqs_store_errors_total", "RLQS reservations the store failed: no grant was renewed for their buckets."),
		shortfalls:  c("ratelimit_rlqs_shortfalls_total", "RLQS grants cut to what the store could still hold (the limit was held for other buckets, or for this one's earlier, higher grants)."),
		dropped:     c("ratelimit_rlqs_dropped_messages_total", "RLQS responses dropped unsent: the Envoy read slower than renewals were sent, or a response could not leave within RLQS_DELIVERY_BOUND."),
		stalled:     c("ratelimit_rlqs_stalled_streams_total", "RLQS streams ended because a response could not leave within RLQS_DELIVERY_BOUND (the Envoy did not read)."),
		panics:      c("ratelimit_rlqs_panics_total", "Panics recovered in RLQS work (a grant round, a stream's report or its sending): the stream it served was ended, the process kept serving."),
	}
}

// Collectors returns the service's series, and gauges of its streams and
// buckets, for a Prometheus registry.
func (s *Service) Collectors() []prometheus.Collector {
	st := s.stats
	gauge := func(name, help string, fn func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, fn)
	}
	return []prometheus.Collector{st.assignments, st.reported, st.anomalies, st.refused, st.shadow, st.abandoned,
		st.storeErrors, st.shortfalls, st.dropped, st.stalled, st.panics,
		gauge("ratelimit_rlqs_streams", "Open RLQS streams.", func() float64 { n, _ := s.counts(); return float64(n) }),
		gauge("ratelimit_rlqs_buckets", "RLQS buckets tracked across streams.", func() float64 { _, n := s.counts(); return float64(n) }),
	}
}

// counts is the streams open and the buckets tracked.
func (s *Service) counts() (streams, buckets int) {
	_ = s.do("counting streams", func(g *state) { streams, buckets = g.counts() })
	return streams, buckets
}

func (g *state) counts() (streams, buckets int) {
	for st := range g.streams {
		buckets += len(st.buckets)
	}
	return len(g.streams), buckets
}

// storeError counts a failed store call and logs it, at most once per
// logEvery, with how many were held back.
func (s *Service) storeError(err error) {
	s.stats.storeErrors.Inc()
	if n, ok := s.storeLog.Due(time.Now()); ok {
		s.o.Logger.WithError(err).WithField("suppressed", n).
			Warn("rlqs: the store failed; no grant is renewed while it does (assignments run out to each Envoy's fallback)")
	}
}

// recovered turns a panic caught in RLQS work into an error: counted,
// logged (at most once per logEvery, with how many were held back, and
// the first's stack), and returned, so that the stream it served ends and
// the process, and every other call it serves, goes on.
func (s *Service) recovered(p *panicked, what string) error {
	s.stats.panics.Inc()
	if n, ok := s.panicLog.Due(time.Now()); ok {
		s.o.Logger.WithField("panic", p.String()).WithField("suppressed", n).WithField("stack", string(p.stack)).
			Error("rlqs: a panic in " + what + " was recovered; the stream it served is ended")
	}
	return status.Errorf(codes.Internal, "rlqs: internal error in %s", what)
}

// logEvery spaces the service's repeated warnings.
const logEvery = 10 * time.Second
