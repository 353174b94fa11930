package rlqstest

import (
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// What a test reads of a fake Envoy.

// Streams is how many streams the fake has opened.
func (e *Envoy) Streams() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.streams
}

// Skipped is how many actions the fake ignored as Envoy does: for an
// empty bucket id or one it does not hold.
func (e *Envoy) Skipped() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.skipped
}

// Actions returns every bucket action received so far.
func (e *Envoy) Actions() []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*rlqsv3.RateLimitQuotaResponse_BucketAction(nil), e.actions...)
}

// Sent returns every report sent so far.
func (e *Envoy) Sent() []*rlqsv3.RateLimitQuotaUsageReports {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*rlqsv3.RateLimitQuotaUsageReports(nil), e.sent...)
}

// Expiries is how many assignments expired (to the fallback, or to the
// default).
func (e *Envoy) Expiries() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.expiries
}

// Strategy is what bucket id enforces now: its assignment, its fallback
// after one expired, or nil for the default (no assignment); held
// reports whether the Envoy holds the bucket at all.
func (e *Envoy) Strategy(id map[string]string) (s *typev3.RateLimitStrategy, held bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	b := e.buckets[keyOf(id)]
	if b == nil {
		return nil, false
	}
	return b.action, true
}
