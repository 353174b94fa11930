package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// LeaseStat is one rule's leased-budget activity on one store: slices
// taken, the hits they held, hits given back, and hits held now.
type LeaseStat struct {
	Slices, Leased, Returned, Held uint64
}

var leaseDescs = [...]*prometheus.Desc{
	prometheus.NewDesc("ratelimit_lease_slices_total", "Slices of a leased rule's budget this replica took from Redis.", []string{"redis", "rule"}, nil),
	prometheus.NewDesc("ratelimit_lease_leased_hits_total", "Hits this replica took in slices (counted in Redis when taken).", []string{"redis", "rule"}, nil),
	prometheus.NewDesc("ratelimit_lease_returned_hits_total", "Hits of slices this replica gave back unspent (idle, reload, shutdown, a hit the slice did not hold).", []string{"redis", "rule"}, nil),
	prometheus.NewDesc("ratelimit_lease_held_hits", "Hits this replica holds in slices now: counted in Redis, not yet admitted.", []string{"redis", "rule"}, nil),
}

// Leases exports a Redis store's lease activity per rule (labelled as
// the other Redis series: REDIS or REDIS_PERSECOND), read from stats at
// each scrape. Rules are config paths: bounded by the config. Each Redis
// (two with REDIS_PERSECOND) adds its source to one collector: Prometheus
// refuses a second collector describing the same series.
func (r *Registry) Leases(redis string, stats func() map[string]LeaseStat) {
	r.leases.add(leaseSource{redis: redis, stats: stats})
	r.leasesOnce.Do(func() { r.prom.MustRegister(&r.leases) })
}

type leaseSource struct {
	redis string
	stats func() map[string]LeaseStat
}

// leaseCollector reads every Redis store's lease stats at a scrape.
type leaseCollector struct {
	mu      sync.Mutex
	sources []leaseSource
}

func (c *leaseCollector) add(s leaseSource) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sources = append(c.sources, s)
}

func (c *leaseCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range leaseDescs {
		ch <- d
	}
}

func (c *leaseCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	sources := c.sources
	c.mu.Unlock()
	for _, src := range sources {
		for rule, st := range src.stats() {
			for i, v := range [...]uint64{st.Slices, st.Leased, st.Returned, st.Held} {
				kind := prometheus.CounterValue
				if i == 3 {
					kind = prometheus.GaugeValue
				}
				ch <- prometheus.MustNewConstMetric(leaseDescs[i], kind, float64(v), src.redis, rule)
			}
		}
	}
}
