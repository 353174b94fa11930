package rlqs

import (
	"context"
	"net"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Bounds on what one client may make the service hold and do: the bytes
// of its bucket ids, and the pace of its reports.

// admitID counts a new bucket's id against the bounds of an id and of
// its stream's and all streams' id bytes, and returns its size; false (and
// counted) past one.
func (g *state) admitID(st *stream, values map[string]string) (int, bool) {
	refuse := func(what string) (int, bool) {
		g.stats.refused.WithLabelValues(what).Inc()
		return 0, false
	}
	if len(values) > maxEntries {
		return refuse("bucket_id_entries")
	}
	size := 0
	for k, v := range values {
		if len(k) > maxField || len(v) > maxField {
			return refuse("bucket_id_size")
		}
		size += len(k) + len(v)
	}
	switch {
	case size > maxIDBytes:
		return refuse("bucket_id_size")
	case st.idBytes+size > g.o.MaxIDBytes:
		return refuse("bucket_id_bytes")
	case g.idBytes+size > g.o.MaxTotalIDBytes:
		return refuse("total_bucket_id_bytes")
	}
	st.idBytes += size
	g.idBytes += size
	return size, true
}

// A stream's reports are taken in at most reportsPerSecond, in bursts of
// up to reportBurst: Envoy reports once an interval (every 1 s at the
// shortest) and a gRPC client once a bucket's interval and for each new
// bucket, far under it, while a flood of reports took the service's CPU
// from its ordinary calls (docs/rlqs.md, "Bounds"). A report past
// the pace is held, merged by bucket, and taken in with the next one (a
// bucket's reports less than a second apart are summed anyway, see
// noteUsage): no count is lost while the stream lasts, and nothing of the
// service is touched for it.
const (
	reportsPerSecond = 20
	reportBurst      = 100
)

// A stream that reports more than twice MaxBuckets bucket usages (at
// least twice DefaultMaxBuckets) in a second of the service's clock is
// ended (ResourceExhausted), and its address's new streams refused for
// floodCooldown: that is what
// an Envoy holding the most buckets a stream may, every one of them new,
// sends in a second at its shortest interval (a report of each new bucket
// at once, and of all of them). Even held, a report costs its decoding and
// merging, almost all of it protobuf's, which the pace alone does not
// bound (docs/rlqs.md gives the figures).

// floodCooldown is how long an address whose stream was ended for its
// report rate has its new streams refused, before any of their reports is
// decoded: reopened at once, each stream would cost the same again.
// maxFlooded bounds the addresses remembered.
const (
	floodCooldown = 10 * time.Second
	maxFlooded    = 10_000
)

// cool refuses host's new streams for floodCooldown from now.
func (s *Service) cool(host string, now time.Time) {
	_ = s.do("refusing a flooding client", func(g *state) { g.cool(host, now) })
}

func (g *state) cool(host string, now time.Time) {
	if g.flooded == nil {
		g.flooded = map[string]time.Time{}
	}
	if len(g.flooded) >= maxFlooded {
		for h, until := range g.flooded {
			if !now.Before(until) {
				delete(g.flooded, h)
			}
		}
		if len(g.flooded) >= maxFlooded {
			return
		}
	}
	g.flooded[host] = now.Add(floodCooldown)
}

// peerHost is the client's address without its port ("" when unknown).
func peerHost(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	if a, ok := p.Addr.(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return p.Addr.String()
}

// reportCounter counts a stream's bucket usages in the current second of
// the service's clock.
type reportCounter struct {
	second int64
	n      int
}

// count counts n usages at now, and reports whether the stream is still
// within max in this second.
func (c *reportCounter) count(now time.Time, n, max int) bool {
	if s := now.Unix(); s != c.second {
		c.second, c.n = s, 0
	}
	c.n += n
	return c.n <= max
}

// reportPacer is a stream's pace of reports: a token bucket on the
// service's clock.
type reportPacer struct {
	tokens float64
	last   time.Time
}

// take reports whether a report may be taken in at now.
func (p *reportPacer) take(now time.Time) bool {
	if d := now.Sub(p.last); d > 0 {
		p.tokens = min(reportBurst, p.tokens+d.Seconds()*reportsPerSecond)
	}
	p.last = now
	if p.tokens < 1 {
		return false
	}
	p.tokens--
	return true
}

// heldReports is a stream's reports past the pace, merged by bucket: each
// bucket's requests and time summed, as one report of the span.
type heldReports struct {
	domain string
	byKey  map[string]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
	order  []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
}

// hold merges msg's usages into h (nil: none held yet); past MaxBuckets
// buckets held, a new bucket's usage is dropped (a client sending that
// many that fast is not an Envoy).
func (s *Service) hold(h *heldReports, msg *rlqsv3.RateLimitQuotaUsageReports) *heldReports {
	if h == nil {
		h = &heldReports{byKey: map[string]*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{}}
	}
	if h.domain == "" {
		h.domain = msg.GetDomain()
	}
	for _, u := range msg.GetBucketQuotaUsages() {
		key := bucketKey(u.GetBucketId().GetBucket())
		if m := h.byKey[key]; m != nil {
			m.NumRequestsAllowed += u.GetNumRequestsAllowed()
			m.NumRequestsDenied += u.GetNumRequestsDenied()
			m.TimeElapsed = durationpb.New(m.GetTimeElapsed().AsDuration() + u.GetTimeElapsed().AsDuration())
			continue
		}
		if len(h.order) >= s.o.MaxBuckets {
			s.stats.anomalies.WithLabelValues("report_dropped").Inc()
			continue
		}
		m := proto.CloneOf(u)
		h.byKey[key] = m
		h.order = append(h.order, m)
	}
	return h
}

// report is what h holds, with msg merged in, as one message.
func (h *heldReports) report(s *Service, msg *rlqsv3.RateLimitQuotaUsageReports) *rlqsv3.RateLimitQuotaUsageReports {
	s.hold(h, msg)
	return &rlqsv3.RateLimitQuotaUsageReports{Domain: h.domain, BucketQuotaUsages: h.order}
}
