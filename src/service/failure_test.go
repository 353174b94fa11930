package service

import (
	"context"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/reload"
)

const policyConfig = `
domain: p
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: open
    failure_policy: allow
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: closed
    failure_policy: deny
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: parent
    failure_policy: local
    descriptors:
      - key: child
        rate_limit: {unit: minute, requests_per_unit: 2}
`

func policyServer(t *testing.T, global config.FailurePolicy) *Server {
	t.Helper()
	f, err := config.Parse("p.yaml", []byte(policyConfig))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Build([]*config.File{f}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := reload.NewHolder(nil)
	_ = h.Install(func() (*config.Config, error) { return cfg, nil })
	fallback := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
	t.Cleanup(fallback.Close)
	s, err := New(Options{Store: failingStore{}, Fallback: fallback, Configs: h, FailurePolicy: global, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestFailurePolicies(t *testing.T) {
	type want struct {
		code    codes.Code // OK means an answer
		overall rlsv3.RateLimitResponse_Code
	}
	tests := []struct {
		name   string
		global config.FailurePolicy
		descs  []string
		calls  []want
	}{
		{"default error", "", []string{"plain=1"}, []want{{code: codes.Unavailable}}},
		{"global allow", "allow", []string{"plain=1"}, []want{{overall: ok}, {overall: ok}, {overall: ok}}},
		{"global deny", "deny", []string{"plain=1"}, []want{{overall: over}}},
		{"descriptor allow beats global error", "error", []string{"open=1"}, []want{{overall: ok}, {overall: ok}, {overall: ok}}},
		{"descriptor deny beats global allow", "allow", []string{"closed=1"}, []want{{overall: over}}},
		{"any error policy makes it Unavailable", "error", []string{"open=1", "plain=1"}, []want{{code: codes.Unavailable}}},
		{"local counts in the fallback, inherited by the child", "error", []string{"parent=x,child=1"}, []want{{overall: ok}, {overall: ok}, {overall: over}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := policyServer(t, tc.global)
			for i, w := range tc.calls {
				r := req("p")
				for _, kv := range tc.descs {
					r.Descriptors = append(r.Descriptors, d(splitComma(kv)...))
				}
				resp, err := s.ShouldRateLimit(context.Background(), r)
				if status.Code(err) != w.code {
					t.Fatalf("call %d: error = %v, want code %v", i, err, w.code)
				}
				if err == nil && resp.GetOverallCode() != w.overall {
					t.Errorf("call %d: overall = %v, want %v", i, resp.GetOverallCode(), w.overall)
				}
			}
		})
	}
}

func splitComma(s string) []string { return strings.Split(s, ",") }
