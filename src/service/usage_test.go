package service

import (
	"context"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/metrics"
)

const usageConfig = `
domain: ai
descriptors:
  - key: tenant
    overdraft: true
    rate_limits:
      - {unit: minute, requests_per_unit: 100}
      - {unit: hour, requests_per_unit: 1000, algorithm: token_bucket}
`

// usage is one descriptor tenant=t with a hits_addend, refunded or not.
func usage(hits uint64, refund bool) *rlv3.RateLimitDescriptor {
	desc := d("tenant=t")
	desc.HitsAddend = wrapperspb.UInt64(hits)
	desc.IsNegativeHits = refund
	return desc
}

// TestUsageReportsThroughTheService: the check-then-report pattern of an AI
// gateway, on a descriptor with two overdraft limits: check (0), report the
// real usage after the fact (counted even past the limit), refund.
func TestUsageReportsThroughTheService(t *testing.T) {
	mem := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
	defer mem.Close()
	reg := metrics.New(metrics.Options{})
	s, err := New(Options{Store: mem, Configs: configs(t, "ai.yaml", usageConfig), Now: func() time.Time { return t0 }, Metrics: reg, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	call := func(desc *rlv3.RateLimitDescriptor) *rlsv3.RateLimitResponse_DescriptorStatus {
		t.Helper()
		resp, err := s.ShouldRateLimit(context.Background(), req("ai", desc))
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetStatuses()[0]
	}
	steps := []struct {
		name string
		desc *rlv3.RateLimitDescriptor
		code rlsv3.RateLimitResponse_Code
		left uint32
	}{
		{"check before the call", usage(0, false), ok, 100},
		{"report 70 tokens", usage(70, false), ok, 30},
		{"report 130 more: counted past the limit", usage(130, false), over, 0},
		{"check: still over", usage(0, false), over, 0},
		{"refund 150", usage(150, true), ok, 50},
		{"check: under the limit again", usage(0, false), ok, 50},
	}
	for _, st := range steps {
		got := call(st.desc)
		if got.GetCode() != st.code || got.GetLimitRemaining() != st.left {
			t.Errorf("%s: %v with %d left, want %v with %d left", st.name, got.GetCode(), got.GetLimitRemaining(), st.code, st.left)
		}
	}
	body := scrape(t, reg)
	for _, want := range []string{
		`ratelimit_service_rate_limit_refunded_hits{domain="ai",key="tenant.fw60"} 150`,
		`ratelimit_service_rate_limit_total_hits{domain="ai",key="tenant.fw60"} 200`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestReportedLimitIsTheOneThatBinds: with a token bucket of 5 a second
// and a burst of 20 beside 5000 an hour (the example's user), the bucket
// is the limit that will reject first, so it is the one reported from the
// first hit on, not the hourly one.
func TestReportedLimitIsTheOneThatBinds(t *testing.T) {
	mem := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
	defer mem.Close()
	s, err := New(Options{Store: mem, Now: func() time.Time { return t0 }, Logger: quietLogger(),
		Configs: configs(t, "u.yaml", `
domain: u
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 20}
      - {unit: hour, requests_per_unit: 5000}
`)})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 21; i++ {
		resp, err := s.ShouldRateLimit(context.Background(), req("u", d("user=a")))
		if err != nil {
			t.Fatal(err)
		}
		st := resp.GetStatuses()[0]
		if got := st.GetCurrentLimit().GetUnit(); got != rlsv3.RateLimitResponse_RateLimit_SECOND {
			t.Fatalf("hit %d reports the %v limit (%d left), want the token bucket's", i, got, st.GetLimitRemaining())
		}
		if want := uint32(max(20-i, 0)); st.GetLimitRemaining() != want {
			t.Errorf("hit %d: %d left, want %d", i, st.GetLimitRemaining(), want)
		}
	}
}
