package rlqstest

import (
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
)

// How a fake Envoy reports: every bucket on one timer (Envoy), or each on
// its own (gRPC).

// reportLoop sends every bucket each interval, reopening a broken stream
// first; when that fails, the counts are dropped, as Envoy drops them.
func (e *Envoy) reportLoop() {
	t := time.NewTicker(e.o.Report)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case now := <-t.C:
			e.mu.Lock()
			if e.stream == nil {
				e.open()
			}
			m := &rlqsv3.RateLimitQuotaUsageReports{Domain: e.o.Domain, BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{}}
			for _, b := range e.buckets {
				m.BucketQuotaUsages = append(m.BucketQuotaUsages, e.usage(b, now.Sub(e.last)))
			}
			e.last = now
			if e.stream != nil {
				e.send(m)
			}
			e.mu.Unlock()
		}
	}
}

// startBucketReports reports b alone on its own interval from now on
// (GRPC), reopening a broken stream first, as reportLoop does for all.
func (e *Envoy) startBucketReports(b *bucket, now time.Time) {
	every := e.o.Report
	if e.o.Bucket != nil {
		if d := e.o.Bucket(b.id); d > 0 {
			every = d
		}
	}
	b.last, b.ticker = now, time.NewTicker(every)
	go func(t *time.Ticker) {
		for {
			select {
			case <-e.ctx.Done():
				return
			case at := <-t.C:
				e.mu.Lock()
				if b.ticker != t {
					e.mu.Unlock()
					return // abandoned
				}
				if e.stream == nil {
					e.open()
				}
				u := e.usage(b, at.Sub(b.last))
				b.last = at
				if e.stream != nil {
					e.send(&rlqsv3.RateLimitQuotaUsageReports{Domain: e.o.Domain, BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{u}})
				}
				e.mu.Unlock()
			}
		}
	}(b.ticker)
}
