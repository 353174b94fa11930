package config

import (
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/openrls/ratelimit/src/config/configtest"
)

const rejectedConfig = `domain: d
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: count
    rejected_hits: count
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: drop
    rejected_hits: drop
    rate_limits:
      - {unit: minute, requests_per_unit: 2}
      - {unit: hour, requests_per_unit: 9, algorithm: sliding_window}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_window}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: token_bucket}
  - key: overdraft
    overdraft: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: lease
    rate_limit: {unit: minute, requests_per_unit: 2, lease: true}
  - key: parent
    rejected_hits: drop
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: child
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: open
    rate_limit: {unlimited: true}
  - key: deny
    rate_limit: {unit: minute, requests_per_unit: 0}
`

// TestRejectedHits: which limits count rejected hits (Rule.CountRejected)
// under each REJECTED_HITS, per descriptor, and for a request's override.
func TestRejectedHits(t *testing.T) {
	tests := []struct {
		def  RejectedHits
		keys []string // descriptor entries, "parent" then "child" for the nested one
		want []bool   // per limit of the matched descriptor
	}{
		{RejectedUnset, []string{"plain"}, []bool{true}},
		{RejectedCount, []string{"plain"}, []bool{true}},
		{RejectedDrop, []string{"plain"}, []bool{false}},
		{RejectedDrop, []string{"count"}, []bool{true}},
		{RejectedCount, []string{"drop"}, []bool{false, false}},
		{RejectedCount, []string{"sliding"}, []bool{false}},
		{RejectedCount, []string{"bucket"}, []bool{false}},
		{RejectedCount, []string{"overdraft"}, []bool{false}},
		{RejectedCount, []string{"lease"}, []bool{false}},
		{RejectedCount, []string{"parent"}, []bool{false}},
		// A limit of 0 counts nothing: no counter per value denied.
		{RejectedCount, []string{"deny"}, []bool{false}},
		// rejected_hits is not inherited.
		{RejectedCount, []string{"parent", "child"}, []bool{true}},
	}
	for _, tt := range tests {
		cfg, err := Build([]*File{mustParse(t, "r.yaml", rejectedConfig)}, Options{RejectedHits: tt.def})
		if err != nil {
			t.Fatal(err)
		}
		var kvs []string
		for _, k := range tt.keys {
			kvs = append(kvs, k+"=v")
		}
		n := cfg.Domain("d").Match(configtest.Desc(kvs...).Entries)
		if n == nil || len(n.limits) != len(tt.want) {
			t.Fatalf("default %q, %v: matched %v, want %d limits", tt.def, tt.keys, n, len(tt.want))
		}
		for i, l := range n.limits {
			if l.Rule.CountRejected != tt.want[i] {
				t.Errorf("default %q, %v limit %d: CountRejected = %v, want %v", tt.def, tt.keys, i, l.Rule.CountRejected, tt.want[i])
			}
		}
	}
}

// TestRejectedHitsOverride: a request's override counts rejected hits as
// its descriptor's first limit does, or by the default where the
// descriptor has no limit of its own.
func TestRejectedHitsOverride(t *testing.T) {
	override := &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE}
	tests := []struct {
		def  RejectedHits
		key  string
		want bool
	}{
		{RejectedCount, "plain", true},
		{RejectedCount, "drop", false},
		{RejectedDrop, "count", true},
		{RejectedCount, "open", true},
		{RejectedDrop, "open", false},
		{RejectedCount, "nomatch", true},
		{RejectedDrop, "nomatch", false},
	}
	for _, tt := range tests {
		cfg, err := Build([]*File{mustParse(t, "r.yaml", rejectedConfig)}, Options{RejectedHits: tt.def})
		if err != nil {
			t.Fatal(err)
		}
		d := configtest.Desc(tt.key + "=v")
		d.Limit = override
		p, err := cfg.Plan("d", []*rlv3.RateLimitDescriptor{d}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Hits) != 1 {
			t.Fatalf("default %q, %s: %d hits, want 1", tt.def, tt.key, len(p.Hits))
		}
		if got := p.Hits[0].Rule.CountRejected; got != tt.want {
			t.Errorf("default %q, %s override: CountRejected = %v, want %v", tt.def, tt.key, got, tt.want)
		}
		p.Release()
	}
}
