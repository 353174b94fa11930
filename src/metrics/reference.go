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
// have none. A rule of three or more levels is counted under its first
// three parts, as the mapping's regular expressions take them (rules that
// share them are summed, as the exporter sums them). Every other statsd
// name, which no mapping line names, is served under the exporter's
// default name: the statsd name with each character other than a letter,
// digit or '_' turned into '_' (ratelimit_go_heapAlloc,
// ratelimit_redis_pool_cx_active, runtime_load_attempts), a counter or a
// gauge as statsd gets it.
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
	type labels struct{ domain, key1, key2 string }
	sums := map[labels][]uint64{}
	var order []labels
	for _, rule := range c.r.Rules() {
		parts := strings.Split(strings.TrimPrefix(rule.stat, "ratelimit.service.rate_limit."), ".")
		if len(parts) < 2 {
			continue
		}
		l := labels{domain: parts[0], key1: parts[1]}
		if len(parts) >= 3 {
			l.key2 = parts[2]
		}
		if sums[l] == nil {
			sums[l] = make([]uint64, len(ruleStatNames))
			order = append(order, l)
		}
		for i, v := range rule.values() {
			sums[l][i] += v
		}
	}
	for _, l := range order {
		for i, n := range ruleStatNames[:5] {
			ch <- prometheus.MustNewConstMetric(refRuleDescs[n], prometheus.CounterValue, float64(sums[l][i]), l.domain, l.key1, l.key2)
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
// same name, as the reference does. Buckets are the exporter's defaults
// (0.005 to 10) either way: the reference only drops the mapping's
// scaling, so with milliseconds every observation of 10 ms or more lands
// in +Inf there, and here, so that histogram_quantile reads alike.
func newReferenceDuration() prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ratelimit_service_response_time_seconds",
		Help: "ShouldRateLimit latency, as envoyproxy/ratelimit reports it.", Buckets: prometheus.DefBuckets,
		ConstLabels: prometheus.Labels{"grpc_method": "ShouldRateLimit"}})
}

// referenceDefaults serves every statsd name no mapping line names under
// the exporter's default name (see the note above). Its names depend on
// what is counted (a domain_not_found per unknown domain), so it describes
// none: an unchecked collector.
type referenceDefaults struct{ r *Registry }

func (referenceDefaults) Describe(chan<- *prometheus.Desc) {}

func (c referenceDefaults) Collect(ch chan<- prometheus.Metric) {
	emit := func(name string, typ prometheus.ValueType, v uint64) {
		d := prometheus.NewDesc(exporterName(name), "statsd "+name+", as envoyproxy/ratelimit's Prometheus sink names it.", nil, nil)
		ch <- prometheus.MustNewConstMetric(d, typ, float64(v))
	}
	for _, st := range c.r.serviceStats() {
		if !refMapped(st.name) {
			emit(st.name, prometheus.CounterValue, st.value())
		}
	}
	for _, st := range c.r.gaugeStats() {
		emit(st.name, prometheus.GaugeValue, st.value())
	}
}

// refMapped reports whether a service-level statsd name is one the
// reference's mapping names (served by referenceCollector).
func refMapped(name string) bool {
	switch name {
	case "ratelimit_server.ShouldRateLimit.total_requests", "ratelimit.service.call.should_rate_limit.redis_error",
		"ratelimit.service.call.should_rate_limit.service_error":
		return true
	}
	_, ok := refConfigLoads[name]
	return ok
}

// exporterName is the statsd exporter's default name for a statsd name.
func exporterName(name string) string {
	b := []byte(name)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	if len(b) > 0 && b[0] >= '0' && b[0] <= '9' {
		return "_" + string(b)
	}
	return string(b)
}

// ReferenceHandler serves, for PROMETHEUS_ADDR, the reference's series
// beside this service's own. This service's per-rule series share their
// names with the reference's but not their labels, so on this handler the
// reference's take their place; everything else of /metrics is there too.
// It needs Options.Reference.
func (r *Registry) ReferenceHandler() http.Handler {
	ref := prometheus.NewRegistry()
	ref.MustRegister(referenceCollector{r}, referenceDefaults{r})
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
