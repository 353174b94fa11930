package metrics

import (
	"bufio"
	"expvar"
	"net/http"
	"strconv"
)

// StatsHandler serves every rule's counters and the service-level ones as
// plain text, one "name: value" line each, named as statsd gets them
// (ratelimit.service.rate_limit.DOMAIN.KEY.STAT; see serviceStats) and
// sorted. The values are totals since start, not deltas. envoyproxy/ratelimit answers /stats on its
// debug port this way, and runbooks grep it ("curl :6070/stats | grep
// over_limit"); then, as it does, Go's expvar. The service-level metrics
// are on /metrics.
func (r *Registry) StatsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		bw := bufio.NewWriter(w)
		for _, rule := range r.Rules() {
			for i, v := range rule.values() {
				_, _ = bw.WriteString(rule.stat + "." + ruleStatNames[i] + ": ")
				_, _ = bw.WriteString(strconv.FormatUint(v, 10))
				_ = bw.WriteByte('\n')
			}
		}
		for _, st := range append(r.serviceStats(), r.gaugeStats()...) {
			_, _ = bw.WriteString(st.name + ": " + strconv.FormatUint(st.value(), 10) + "\n")
		}
		// What envoyproxy/ratelimit's /stats shows: Go's published
		// variables (cmdline, memstats), one "NAME: JSON" line each.
		expvar.Do(func(kv expvar.KeyValue) {
			_, _ = bw.WriteString(kv.Key + ": " + kv.Value.String() + "\n")
		})
		_ = bw.Flush()
	})
}
