package metrics

import "github.com/prometheus/client_golang/prometheus"

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
// each scrape. Rules are config paths: bounded by the config.
func (r *Registry) Leases(redis string, stats func() map[string]LeaseStat) {
	r.prom.MustRegister(leaseCollector{redis: redis, stats: stats})
}

type leaseCollector struct {
	redis string
	stats func() map[string]LeaseStat
}

func (c leaseCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range leaseDescs {
		ch <- d
	}
}

func (c leaseCollector) Collect(ch chan<- prometheus.Metric) {
	for rule, st := range c.stats() {
		for i, v := range [...]uint64{st.Slices, st.Leased, st.Returned, st.Held} {
			kind := prometheus.CounterValue
			if i == 3 {
				kind = prometheus.GaugeValue
			}
			ch <- prometheus.MustNewConstMetric(leaseDescs[i], kind, float64(v), c.redis, rule)
		}
	}
}
