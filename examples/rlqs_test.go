package examples

import (
	"time"

	"testing"

	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// TestEnvoyRLQSExample validates the RLQS bootstrap against Envoy's API
// (the filter's config and its bucket settings unpacked and validated
// too), and checks it against its descriptor config: the filter's server
// is an HTTP/2 cluster, its domain is in the config, the buckets it builds
// reach limits there, and both fallbacks are DENY_ALL as the fleet
// guarantee assumes (docs/rlqs.md).
func TestEnvoyRLQSExample(t *testing.T) {
	b, cfg := loadExample(t, "envoy-rlqs.yaml", "rlqs-ratelimit-config.yaml")
	var filter *rlqsfilterv3.RateLimitQuotaFilterConfig
	for _, h := range connectionManagers(b) {
		for _, f := range h.GetHttpFilters() {
			c := &rlqsfilterv3.RateLimitQuotaFilterConfig{}
			if f.GetTypedConfig().UnmarshalTo(c) == nil {
				filter = c
			}
		}
	}
	if filter == nil {
		t.Fatal("no rate_limit_quota filter in envoy-rlqs.yaml")
	}
	if err := filter.ValidateAll(); err != nil {
		t.Fatalf("the filter's config fails Envoy's validation: %v", err)
	}
	cluster := filter.GetRlqsServer().GetEnvoyGrpc().GetClusterName()
	found := false
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == cluster {
			found = true
		}
	}
	if !found {
		t.Fatalf("the RLQS server's cluster %q is not defined", cluster)
	}
	if cfg.Domain(filter.GetDomain()) == nil {
		t.Fatalf("the filter's domain %q is not in rlqs-ratelimit-config.yaml", filter.GetDomain())
	}
	settings := &rlqsfilterv3.RateLimitQuotaBucketSettings{}
	if err := filter.GetBucketMatchers().GetOnNoMatch().GetAction().GetTypedConfig().UnmarshalTo(settings); err != nil {
		t.Fatalf("the bucket settings: %v", err)
	}
	if err := settings.ValidateAll(); err != nil {
		t.Fatalf("the bucket settings fail Envoy's validation: %v", err)
	}
	// docs/rlqs.md shows this example at the shortest interval Envoy offers.
	if got := settings.GetReportingInterval().AsDuration(); got != time.Second {
		t.Errorf("the bucket settings report every %v, want 1s (docs/rlqs.md)", got)
	}
	deny := typev3.RateLimitStrategy_DENY_ALL
	if settings.GetNoAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != deny ||
		settings.GetExpiredAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != deny {
		t.Error("no_assignment_behavior and expired_assignment_behavior must fall back to DENY_ALL")
	}
	keys := map[string]string{}
	for k := range settings.GetBucketIdBuilder().GetBucketIdBuilder() {
		keys[k] = "acme"
	}
	for _, v := range []string{"acme", "someone-else"} {
		for k := range keys {
			keys[k] = v
		}
		p, err := cfg.PlanBucket(filter.GetDomain(), keys)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Hits) == 0 {
			t.Errorf("the bucket %v reaches no limit in rlqs-ratelimit-config.yaml", keys)
		}
		p.Release()
	}
}
