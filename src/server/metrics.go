package server

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/openrls/ratelimit/src/logthrottle"
	"github.com/openrls/ratelimit/src/metrics"
	"github.com/openrls/ratelimit/src/server/h2guard"
)

// GuardMetrics counts what the gRPC guards did, by event, and logs a
// connection they closed for abuse at most once per event and 10 s, with
// how many were held back (an attacker must not flood the log either):
// Options.OnGuard.
func GuardMetrics(reg *metrics.Registry, log logrus.FieldLogger) func(h2guard.Event) {
	events := h2guard.Events
	counts := make(map[h2guard.Event]*atomic.Uint64, len(events))
	for _, e := range events {
		counts[e] = new(atomic.Uint64)
		reg.CounterFunc("ratelimit_grpc_guard_total", "gRPC connections closed, refused or held in line, and streams and calls refused, by the listener's guards, by event.",
			prometheus.Labels{"event": string(e)}, func() float64 { return float64(counts[e].Load()) })
	}
	logged := map[h2guard.Event]*logthrottle.Throttle{}
	for _, e := range []h2guard.Event{h2guard.EventRapidReset, h2guard.EventUnreadAnswers, h2guard.EventResetInLine,
		h2guard.EventRequestBytes, h2guard.EventBudgetFull, h2guard.EventStalledBody, h2guard.EventPendingStreams,
		h2guard.EventPendingFull, h2guard.EventStalledRequest, h2guard.EventHeaderBlock, h2guard.EventRefusedStreams} {
		logged[e] = &logthrottle.Throttle{Every: 10 * time.Second}
	}
	return func(e h2guard.Event) {
		counts[e].Add(1)
		if th := logged[e]; th != nil {
			if n, ok := th.Due(time.Now()); ok {
				what := "closed a gRPC connection abusing the protocol (counted in ratelimit_grpc_guard_total)"
				if e.Stream() {
					what = "refused a gRPC stream past the listener's bounds, its connection kept (counted in ratelimit_grpc_guard_total)"
				}
				log.WithField("event", string(e)).WithField("suppressed", n).Warn(what)
			}
		}
	}
}

// HTTPConnMetrics counts the connections the HTTP listeners close of their
// own accord, by port and why: Options.OnHTTPConn.
func HTTPConnMetrics(reg *metrics.Registry) func(port, why string) {
	type key struct{ port, why string }
	counts := map[key]*atomic.Uint64{}
	for _, port := range []string{"http", "debug", "metrics"} {
		for _, why := range []string{HTTPRefused, HTTPEvictedIdle} {
			n := new(atomic.Uint64)
			counts[key{port, why}] = n
			reg.CounterFunc("ratelimit_http_connections_closed_total",
				"Connections an HTTP listener closed at its caps (HTTP_MAX_CONNECTIONS, _PER_ADDRESS): refused while every "+
					"connection was busy, or idle keep-alive ones evicted for a new one.",
				prometheus.Labels{"port": port, "why": why}, func() float64 { return float64(n.Load()) })
		}
	}
	return func(port, why string) {
		if n := counts[key{port, why}]; n != nil {
			n.Add(1)
		}
	}
}
