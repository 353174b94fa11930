// Package metrics counts what the service decides, per rule and for the
// service as a whole, and exports it to Prometheus (/metrics) and statsd.
//
// Per-rule counters are plain atomics bumped on the request path; exporters
// read them when scraped or flushed. Rules are labelled by domain and the
// rule's config path, never by raw request values, except where a rule asks
// for values (detailed_metric, value_to_metric); those series are capped per
// process (MaxDetailedSeries) and the excess folds into the rule's own path.
// Cardinality therefore stays bounded whatever the requests hold.
package metrics

import (
	"math"
	"net/http"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

// Options configures a Registry.
type Options struct {
	// NearLimitRatio is the share of a limit above which an allowed hit
	// counts as near_limit (NEAR_LIMIT_RATIO); 0 means 0.8.
	NearLimitRatio float64
	// MaxDetailedSeries caps the rules named by request values; 0 means 1000.
	MaxDetailedSeries int
	// FailurePolicies are the policies whose series exist from the start,
	// so that rate() and alerts see a failure from its first hit.
	FailurePolicies []string
	// Reference keeps the reference's response time histogram for
	// ReferenceHandler (USE_PROMETHEUS); ReferenceMillis reports it in
	// milliseconds (PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS).
	Reference, ReferenceMillis bool
}

// Registry holds every counter. It is safe for concurrent use.
type Registry struct {
	near        float64
	maxDetailed int64
	detailed    atomic.Int64
	rules       sync.Map // ruleKey → *Rule

	prom            *prometheus.Registry
	requests        *prometheus.CounterVec
	byOutcome       map[string]prometheus.Counter // resolved once: no label hashing per call
	requestDuration prometheus.Histogram
	refDuration     prometheus.Histogram // nil unless Options.Reference
	refMillis       bool
	backendErrors   prometheus.Counter
	backendDuration prometheus.Histogram
	shadowOverrides prometheus.Counter
	cancelled       prometheus.Counter
	failurePolicy   *prometheus.CounterVec

	statsMu    sync.Mutex
	extraStats []serviceStat // added by StatFunc
	gauges     []serviceStat // added by GaugeStatFunc

	notFound notFound // domain_not_found, per unknown domain

	leases     leaseCollector // every Redis store's, registered once
	leasesOnce sync.Once

	// timings are the queues of response times, one per running flusher
	// (statsd, DogStatsD, a Prometheus mapping): each gets every one.
	timings atomic.Pointer[[]*timingQueue]
}

// serviceStat is one service-level counter as statsd and /stats name it.
type serviceStat struct {
	name  string
	value func() uint64
}

type ruleKey struct{ domain, key string }

// Rule is one rule's counters, in hits (a request's hits_addend counts as
// that many hits).
type Rule struct {
	Domain, Key                                  string
	TotalHits, OverLimit, NearLimit, WithinLimit atomic.Uint64
	ShadowMode                                   atomic.Uint64
	// Refunded counts hits given back (is_negative_hits); they are not
	// in TotalHits.
	Refunded atomic.Uint64
	// OverLimitWithLocalCache counts the over_limit hits the local
	// over-limit cache answered (LOCAL_CACHE_SIZE_IN_BYTES).
	OverLimitWithLocalCache atomic.Uint64
	// stat is the rule's statsd and /stats name prefix, made safe once.
	stat string
}

// New returns a Registry with the service-level metrics and Go runtime
// collectors registered.
func New(o Options) *Registry {
	if o.NearLimitRatio <= 0 {
		o.NearLimitRatio = 0.8
	}
	if o.MaxDetailedSeries <= 0 {
		o.MaxDetailedSeries = 1000
	}
	r := &Registry{near: o.NearLimitRatio, maxDetailed: int64(o.MaxDetailedSeries), prom: prometheus.NewRegistry()}
	r.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_requests_total",
		Help: "ShouldRateLimit calls by outcome: ok, over_limit, invalid, unavailable, error."}, []string{"code"})
	r.requestDuration = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ratelimit_request_duration_seconds",
		Help: "ShouldRateLimit latency.", Buckets: latencyBuckets})
	r.backendErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_backend_errors_total",
		Help: "Store calls that failed."})
	r.backendDuration = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ratelimit_backend_duration_seconds",
		Help: "Store call latency (one round trip for Redis).", Buckets: latencyBuckets})
	r.shadowOverrides = prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_global_shadow_mode_total",
		Help: "OVER_LIMIT answers turned into OK by SHADOW_MODE."})
	r.cancelled = prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_requests_cancelled_total",
		Help: "ShouldRateLimit calls the client cancelled before they were handled; no decision was made."})
	r.failurePolicy = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_failure_policy_total",
		Help: "Hits answered by a failure policy because the store failed."}, []string{"policy"})
	if o.Reference {
		r.refDuration, r.refMillis = newReferenceDuration(), o.ReferenceMillis
	}
	r.byOutcome = map[string]prometheus.Counter{}
	for _, code := range outcomeCodes {
		r.byOutcome[code] = r.requests.WithLabelValues(code)
	}
	for _, p := range o.FailurePolicies {
		r.failurePolicy.WithLabelValues(p)
	}
	r.prom.MustRegister(r.requests, r.requestDuration, r.backendErrors, r.backendDuration, r.shadowOverrides, r.failurePolicy, r.cancelled,
		ruleCollector{r}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// outcomeCodes are every code Request is given (the service's outcomes).
var outcomeCodes = []string{"ok", "over_limit", "invalid", "unavailable", "error"}

// counterValue reads a Prometheus counter (only for statsd and /stats, not
// on the request path).
func counterValue(c prometheus.Counter) uint64 {
	var m dto.Metric
	if c.Write(&m) != nil {
		return 0
	}
	return uint64(m.GetCounter().GetValue())
}

var latencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1}

// Rule returns the counters of a rule, creating them on first use. A
// detailed key (one built from request values) beyond the cap returns the
// counters of fallback, the rule's own path.
func (r *Registry) Rule(domain, key string, detailed bool, fallback string) *Rule {
	k := ruleKey{domain, key}
	if v, ok := r.rules.Load(k); ok {
		return v.(*Rule)
	}
	if detailed && r.detailed.Add(1) > r.maxDetailed {
		r.detailed.Add(-1)
		return r.Rule(domain, fallback, false, fallback)
	}
	v, loaded := r.rules.LoadOrStore(k, &Rule{Domain: domain, Key: key, stat: ruleStatPrefix(domain, key)})
	if loaded && detailed {
		r.detailed.Add(-1)
	}
	return v.(*Rule)
}

// Decision is one hit's outcome on a rule, as the counters see it.
type Decision struct {
	// Hits is the cost; Limit the rule's limit. Used is the count the
	// store reported: after the hits when they were allowed, before them
	// when rejected (a rejected hit counts nothing here).
	Hits, Used, Limit uint64
	Allowed           bool
	// Shadow is set for a rule in shadow mode; Cached when the local
	// over-limit cache answered without the store.
	Shadow, Cached bool
}

// Hit records one decision on a rule, split as envoyproxy/ratelimit splits
// it, so that its dashboards read the same: of hits that cross the limit,
// those up to it are near_limit and the rest over_limit; of allowed hits,
// those past floor(limit * NEAR_LIMIT_RATIO) are near_limit (and all are
// within_limit). Counters saturate at 2^64-1 instead of wrapping: a wrap
// reads as a counter reset to Prometheus.
func (r *Registry) Hit(rule *Rule, d Decision) {
	addSat(&rule.TotalHits, d.Hits)
	// The reference computes the threshold in float32.
	near := uint64(math.Floor(float64(float32(d.Limit) * float32(r.near))))
	if d.Allowed {
		addSat(&rule.WithinLimit, d.Hits)
		if before := d.Used - min(d.Hits, d.Used); d.Used > near {
			addSat(&rule.NearLimit, d.Used-max(near, before))
		}
		return
	}
	over := d.Hits
	if before, after := d.Used, satAdd(d.Used, d.Hits); before < d.Limit && after > d.Limit {
		over = after - d.Limit
		addSat(&rule.NearLimit, d.Limit-max(near, before))
	}
	addSat(&rule.OverLimit, over)
	if d.Cached {
		addSat(&rule.OverLimitWithLocalCache, d.Hits)
	}
	if d.Shadow {
		addSat(&rule.ShadowMode, over)
	}
}

func satAdd(a, b uint64) uint64 {
	if a+b < a {
		return math.MaxUint64
	}
	return a + b
}

// Refund records hits given back on a rule.
func (r *Registry) Refund(rule *Rule, hits uint64) { addSat(&rule.Refunded, hits) }

// addSat adds d to c, saturating at 2^64-1. The add that overflows stores
// the maximum right after: a scrape between the two is the only moment a
// wrapped value can be seen, and only past 2^64 hits.
func addSat(c *atomic.Uint64, d uint64) {
	if v := c.Add(d); v < d {
		c.Store(math.MaxUint64)
	}
}

// Request records one ShouldRateLimit call.
func (r *Registry) Request(code string, d time.Duration) {
	if c, ok := r.byOutcome[code]; ok {
		c.Inc()
	} else {
		r.requests.WithLabelValues(code).Inc()
	}
	r.requestDuration.Observe(d.Seconds())
	if r.refDuration != nil {
		if r.refMillis {
			r.refDuration.Observe(float64(d) / float64(time.Millisecond))
		} else {
			r.refDuration.Observe(d.Seconds())
		}
	}
	if qs := r.timings.Load(); qs != nil {
		for _, q := range *qs {
			q.observe(d)
		}
	}
}

// addTimings adds a flusher's queue of response times.
func (r *Registry) addTimings(q *timingQueue) {
	for {
		old := r.timings.Load()
		var qs []*timingQueue
		if old != nil {
			qs = append(qs, *old...)
		}
		qs = append(qs, q)
		if r.timings.CompareAndSwap(old, &qs) {
			return
		}
	}
}

// Cancelled records a call cancelled before it was handled.
func (r *Registry) Cancelled() { r.cancelled.Inc() }

// Backend records one store call.
func (r *Registry) Backend(d time.Duration, err error) {
	r.backendDuration.Observe(d.Seconds())
	if err != nil {
		r.backendErrors.Inc()
	}
}

// FailurePolicy records one hit answered by a failure policy.
func (r *Registry) FailurePolicy(policy string) { r.failurePolicy.WithLabelValues(policy).Inc() }

// ShadowOverride records an OVER_LIMIT answer turned OK by SHADOW_MODE.
func (r *Registry) ShadowOverride() { r.shadowOverrides.Inc() }

// StatFunc adds a service-level counter, read from fn, to what statsd and
// /stats report (config loads: counted by the config package).
func (r *Registry) StatFunc(name string, fn func() uint64) {
	r.statsMu.Lock()
	defer r.statsMu.Unlock()
	r.extraStats = append(r.extraStats, serviceStat{name, fn})
}

// GaugeStatFunc adds a service-level gauge, read from fn, to what statsd
// (as "NAME:VALUE|g" at every flush) and /stats report: the reference's
// local cache gauges (ratelimit.localcache.*).
func (r *Registry) GaugeStatFunc(name string, fn func() uint64) {
	r.statsMu.Lock()
	defer r.statsMu.Unlock()
	r.gauges = append(r.gauges, serviceStat{name, fn})
}

// gaugeStats returns the gauges GaugeStatFunc added, sorted by name.
func (r *Registry) gaugeStats() []serviceStat {
	r.statsMu.Lock()
	out := slices.Clone(r.gauges)
	r.statsMu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// serviceStats returns the service-level counters sorted by name, named as
// envoyproxy/ratelimit names them in statsd, so dashboards and the
// statsd-exporter mappings built on its names carry over: total requests,
// errors by kind (redis_error: the store failed; service_error: the request
// was refused), global shadow mode overrides, and what StatFunc added. The
// values are read from the Prometheus counters, so nothing is counted twice.
func (r *Registry) serviceStats() []serviceStat {
	outcomes := func(codes ...string) func() uint64 {
		return func() uint64 {
			var n uint64
			for _, c := range codes {
				n += counterValue(r.byOutcome[c])
			}
			return n
		}
	}
	out := []serviceStat{
		{"ratelimit_server.ShouldRateLimit.total_requests", outcomes(outcomeCodes...)},
		{"ratelimit.service.call.should_rate_limit.redis_error", func() uint64 { return counterValue(r.backendErrors) }},
		{"ratelimit.service.call.should_rate_limit.service_error", outcomes("invalid", "error")},
		{"ratelimit.service.global_shadow_mode", func() uint64 { return counterValue(r.shadowOverrides) }},
	}
	r.statsMu.Lock()
	out = append(out, r.extraStats...)
	r.statsMu.Unlock()
	out = append(out, r.notFoundStats()...)
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// GaugeFunc registers a gauge read from fn at scrape time.
func (r *Registry) GaugeFunc(name, help string, labels prometheus.Labels, fn func() float64) {
	r.prom.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, fn))
}

// InfoFunc registers an info metric: a gauge of 1 whose one label, read
// from fn at scrape time, names the current state (the config's version,
// say); no series while fn returns "".
func (r *Registry) InfoFunc(name, help, label string, fn func() string) {
	r.prom.MustRegister(infoCollector{desc: prometheus.NewDesc(name, help, []string{label}, nil), fn: fn})
}

type infoCollector struct {
	desc *prometheus.Desc
	fn   func() string
}

func (c infoCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c infoCollector) Collect(ch chan<- prometheus.Metric) {
	if v := c.fn(); v != "" {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, 1, v)
	}
}

// MustRegister adds a collector of another package's series.
func (r *Registry) MustRegister(c prometheus.Collector) { r.prom.MustRegister(c) }

// CounterFunc registers a counter read from fn at scrape time (config loads,
// local cache hits: values other packages already count).
func (r *Registry) CounterFunc(name, help string, labels prometheus.Labels, fn func() float64) {
	r.prom.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, fn))
}

// Handler serves the Prometheus exposition format.
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.prom, promhttp.HandlerOpts{})
}

// Rules returns a snapshot of every rule's counters, sorted, for statsd.
func (r *Registry) Rules() []*Rule {
	var out []*Rule
	r.rules.Range(func(_, v any) bool { out = append(out, v.(*Rule)); return true })
	sort.Slice(out, func(i, j int) bool {
		if out[i].Domain != out[j].Domain {
			return out[i].Domain < out[j].Domain
		}
		return out[i].Key < out[j].Key
	})
	return out
}

// ruleCollector exports the per-rule atomics as Prometheus counters.
type ruleCollector struct{ r *Registry }

// ruleStatNames are the per-rule stats, named as envoyproxy/ratelimit names
// them, so dashboards built on its statsd names carry over.
// refunded_hits is ours (the reference has no refunds).
var ruleStatNames = [ruleStats]string{"total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode", "refunded_hits",
	"over_limit_with_local_cache"}

// ruleStats is how many counters a rule has.
const ruleStats = 7

// ruleDescs is built once and never changed.
var ruleDescs = func() map[string]*prometheus.Desc {
	m := map[string]*prometheus.Desc{}
	for _, n := range ruleStatNames {
		m[n] = prometheus.NewDesc("ratelimit_service_rate_limit_"+n,
			"Hits per rate limit rule ("+n+"), labelled by domain and the rule's descriptor path.", []string{"domain", "key"}, nil)
	}
	return m
}()

func (c ruleCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range ruleDescs {
		ch <- d
	}
}

func (c ruleCollector) Collect(ch chan<- prometheus.Metric) {
	c.r.rules.Range(func(_, v any) bool {
		rule := v.(*Rule)
		for i, val := range rule.values() {
			ch <- prometheus.MustNewConstMetric(ruleDescs[ruleStatNames[i]], prometheus.CounterValue, float64(val), rule.Domain, rule.Key)
		}
		return true
	})
}

// values returns the counters in ruleStatNames order.
func (rule *Rule) values() [ruleStats]uint64 {
	return [ruleStats]uint64{rule.TotalHits.Load(), rule.OverLimit.Load(), rule.NearLimit.Load(), rule.WithinLimit.Load(), rule.ShadowMode.Load(),
		rule.Refunded.Load(), rule.OverLimitWithLocalCache.Load()}
}
