package metrics

import (
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

// The series envoyproxy/ratelimit serves with USE_PROMETHEUS=true: its
// statsd names through the statsd-exporter mapping it ships (and Envoy
// Gateway installs), so that dashboards and alerts built on them keep
// working. Per-rule counters are labelled domain, key1 and key2 from the
// dot-separated statsd name; key2 is empty for one-level rules, which
// Prometheus stores as no key2 label, as the reference's one-level series
// have none. Rules of three or more levels match none of the reference's
// mapping lines, so they appear only in this service's own series.
var (
	refRuleDescs = func() map[string]*prometheus.Desc {
		m := map[string]*prometheus.Desc{}
		for _, n := range ruleStatNames[:5] {
			m[n] = prometheus.NewDesc("ratelimit_service_rate_limit_"+n, "Hits per rate limit rule ("+n+"), as envoyproxy/ratelimit names them.",
				[]string{"domain", "key1", "key2"}, nil)
		}
		return m
	}()
	refTotalRequests = prometheus.NewDesc("ratelimit_service_total_requests", "ShouldRateLimit calls.", []string{"grpc_method"}, nil)
	refErrors        = prometheus.NewDesc("ratelimit_service_should_rate_limit_error",
		"ShouldRateLimit calls that failed: redis_error (the store failed), service_error (the request was refused).", []string{"err_type"}, nil)
	refConfigLoads = map[string]*prometheus.Desc{
		"ratelimit.service.config_load_success": prometheus.NewDesc("ratelimit_service_config_load_success", "Config loads that were served.", nil, nil),
		"ratelimit.service.config_load_error":   prometheus.NewDesc("ratelimit_service_config_load_error", "Config loads rejected.", nil, nil),
	}
)

// referenceCollector exports the reference's counters from the same atomics
// and counters as this service's own series: nothing is counted twice.
type referenceCollector struct{ r *Registry }

func (c referenceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range refRuleDescs {
		ch <- d
	}
	ch <- refTotalRequests
	ch <- refErrors
	for _, d := range refConfigLoads {
		ch <- d
	}
}

func (c referenceCollector) Collect(ch chan<- prometheus.Metric) {
	for _, rule := range c.r.Rules() {
		parts := strings.Split(strings.TrimPrefix(rule.stat, "ratelimit.service.rate_limit."), ".")
		if len(parts) != 2 && len(parts) != 3 {
			continue
		}
		key2 := ""
		if len(parts) == 3 {
			key2 = parts[2]
		}
		vals := rule.values()
		for i, n := range ruleStatNames[:5] {
			ch <- prometheus.MustNewConstMetric(refRuleDescs[n], prometheus.CounterValue, float64(vals[i]), parts[0], parts[1], key2)
		}
	}
	for _, st := range c.r.serviceStats() {
		v := float64(st.value())
		switch st.name {
		case "ratelimit_server.ShouldRateLimit.total_requests":
			ch <- prometheus.MustNewConstMetric(refTotalRequests, prometheus.CounterValue, v, "ShouldRateLimit")
		case "ratelimit.service.call.should_rate_limit.redis_error":
			ch <- prometheus.MustNewConstMetric(refErrors, prometheus.CounterValue, v, "redis_error")
		case "ratelimit.service.call.should_rate_limit.service_error":
			ch <- prometheus.MustNewConstMetric(refErrors, prometheus.CounterValue, v, "service_error")
		default:
			if d, ok := refConfigLoads[st.name]; ok {
				ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
			}
		}
	}
}

// newReferenceDuration is the reference's response time histogram, in
// seconds (the statsd exporter's conversion of its millisecond timer) or,
// with PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS, in milliseconds under the
// same name, as the reference does. Buckets are the exporter's defaults.
func newReferenceDuration(millis bool) prometheus.Histogram {
	buckets := prometheus.DefBuckets
	if millis {
		buckets = make([]float64, len(prometheus.DefBuckets))
		for i, b := range prometheus.DefBuckets {
			buckets[i] = b * 1000
		}
	}
	return prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ratelimit_service_response_time_seconds",
		Help: "ShouldRateLimit latency, as envoyproxy/ratelimit reports it.", Buckets: buckets,
		ConstLabels: prometheus.Labels{"grpc_method": "ShouldRateLimit"}})
}

// ReferenceHandler serves, for PROMETHEUS_ADDR, the reference's series
// beside this service's own. This service's per-rule series share their
// names with the reference's but not their labels, so on this handler the
// reference's take their place; everything else of /metrics is there too.
// It needs Options.Reference.
func (r *Registry) ReferenceHandler() http.Handler {
	ref := prometheus.NewRegistry()
	ref.MustRegister(referenceCollector{r})
	if r.refDuration != nil {
		ref.MustRegister(r.refDuration)
	}
	own := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		mfs, err := r.prom.Gather()
		out := mfs[:0]
		for _, mf := range mfs {
			if !strings.HasPrefix(mf.GetName(), "ratelimit_service_rate_limit_") {
				out = append(out, mf)
			}
		}
		return out, err
	})
	return promhttp.HandlerFor(prometheus.Gatherers{own, ref}, promhttp.HandlerOpts{})
}
