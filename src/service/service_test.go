package service

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/metrics"
)

const testConfig = `
domain: web
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: ip
    value: 10.0.0.1
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota
    quota_mode: true
    metadata: {team: growth}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: token_bucket}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: multi
    rate_limits:
      - {unit: second, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 3, name: hourly}
  - key: windowed
    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 1}
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tagged
    metadata: {team: payments, owner: {name: ana, shift: day}}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: tagged2
    metadata: {owner: {name: bo, site: lisbon}, tier: gold}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 100}
`

// t0 is 10.5s into a minute, so reset times are not whole numbers.
var t0 = time.Unix(1_699_999_200, 0).Add(10*time.Second + 500*time.Millisecond)

// configs parses and builds one config file and serves it.
func configs(t testing.TB, name, yaml string) *atomic.Pointer[config.Config] {
	t.Helper()
	f, err := config.Parse(name, []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Build([]*config.File{f}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var cur atomic.Pointer[config.Config]
	cur.Store(cfg)
	return &cur
}

func newTestServer(t testing.TB, opts Options) *Server {
	t.Helper()
	cur := configs(t, "test.yaml", testConfig)
	if opts.Store == nil {
		mem := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
		t.Cleanup(mem.Close)
		opts.Store = mem
	}
	opts.Configs = cur
	opts.Logger = quietLogger()
	opts.Now = func() time.Time { return t0 }
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func req(domain string, descs ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: descs}
}

// d builds a request descriptor from "key=value" pairs.
var d = configtest.Desc

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

func limit(rpu uint32, u rlsv3.RateLimitResponse_RateLimit_Unit) *rlsv3.RateLimitResponse_RateLimit {
	return &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: rpu, Unit: u}
}

func st(code rlsv3.RateLimitResponse_Code, l *rlsv3.RateLimitResponse_RateLimit, rem uint32, reset time.Duration) *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{Code: code, CurrentLimit: l, LimitRemaining: rem, DurationUntilReset: durationpb.New(reset)}
}

func TestShouldRateLimit(t *testing.T) {
	minute := rlsv3.RateLimitResponse_RateLimit_MINUTE
	reset := 49500 * time.Millisecond
	type call struct {
		req  *rlsv3.RateLimitRequest
		want *rlsv3.RateLimitResponse
	}
	tests := []struct {
		name  string
		opts  Options
		calls []call
	}{
		{"ok then over limit", Options{}, []call{
			{req("web", d("ip=1")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, limit(2, minute), 1, reset)}}},
			{req("web", d("ip=1")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, limit(2, minute), 0, reset)}}},
			{req("web", d("ip=1")), &rlsv3.RateLimitResponse{OverallCode: over, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st(over, limit(2, minute), 0, reset)}}},
		}},
		{"unknown domain, no match, unlimited", Options{}, []call{
			{req("other", d("ip=1")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: ok}}}},
			{req("web", d("nope=1"), d("ip=10.0.0.1")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				{Code: ok}, {Code: ok, LimitRemaining: math.MaxUint32}}}},
		}},
		{"shadow mode descriptor answers OK", Options{}, []call{
			{req("web", d("shadow=1")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, limit(1, minute), 0, reset)}}},
			{req("web", d("shadow=1")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, limit(1, minute), 0, reset)}}},
		}},
		{"quota mode reports, and rejects only when every quota is spent", Options{}, []call{
			{req("web", d("quota=1")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, limit(1, minute), 0, reset)}}},
			{req("web", d("quota=1"), d("quota=2")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				st(over, limit(1, minute), 0, reset), st(ok, limit(1, minute), 0, reset)}}},
			{req("web", d("quota=1"), d("quota=2")), &rlsv3.RateLimitResponse{OverallCode: over, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				st(over, limit(1, minute), 0, reset), st(over, limit(1, minute), 0, reset)}}},
		}},
		{"quota mode beside a rate limit that rejects", Options{}, []call{
			{req("web", d("quota=4"), d("ip=20")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				st(ok, limit(1, minute), 0, reset), st(ok, limit(2, minute), 1, reset)}}},
			{req("web", d("quota=5"), d("ip=20")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				st(ok, limit(1, minute), 0, reset), st(ok, limit(2, minute), 0, reset)}}},
			{req("web", d("quota=6"), d("ip=20")), &rlsv3.RateLimitResponse{OverallCode: over, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				st(ok, limit(1, minute), 0, reset), st(over, limit(2, minute), 0, reset)}}},
		}},
		{"global quota mode", Options{QuotaMode: true}, []call{
			{req("web", d("ip=7"), d("ip=8")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				st(ok, limit(2, minute), 1, reset), st(ok, limit(2, minute), 1, reset)}}},
			{req("web", d("ip=7"), d("ip=7"), d("ip=9")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				st(ok, limit(2, minute), 0, reset), st(over, limit(2, minute), 0, reset), st(ok, limit(2, minute), 1, reset)}}},
			{req("web", d("ip=7")), &rlsv3.RateLimitResponse{OverallCode: over, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st(over, limit(2, minute), 0, reset)}}},
		}},
		// As the reference: a descriptor with no limit (nothing matched) is
		// a passing quota descriptor under QUOTA_MODE, so the request
		// passes while its limited descriptor is over; an unlimited one is
		// no quota descriptor.
		{"global quota mode beside a descriptor without a limit", Options{QuotaMode: true}, []call{
			{req("web", d("nope=x"), d("ip=11")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				{Code: ok}, st(ok, limit(2, minute), 1, reset)}}},
			{req("web", d("nope=x"), d("ip=11")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				{Code: ok}, st(ok, limit(2, minute), 0, reset)}}},
			{req("web", d("nope=x"), d("ip=11")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				{Code: ok}, st(over, limit(2, minute), 0, reset)}}},
			{req("web", d("ip=10.0.0.1"), d("ip=11")), &rlsv3.RateLimitResponse{OverallCode: over, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				{Code: ok, LimitRemaining: math.MaxUint32}, st(over, limit(2, minute), 0, reset)}}},
		}},
		// A shadow-mode descriptor passes as a quota descriptor too.
		{"global quota mode beside a shadow-mode descriptor", Options{QuotaMode: true}, []call{
			{req("web", d("shadow=3"), d("ip=13")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				st(ok, limit(1, minute), 0, reset), st(ok, limit(2, minute), 1, reset)}}},
			{req("web", d("shadow=3"), d("ip=13")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				st(ok, limit(1, minute), 0, reset), st(ok, limit(2, minute), 0, reset)}}},
			{req("web", d("shadow=3"), d("ip=13")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				st(ok, limit(1, minute), 0, reset), st(over, limit(2, minute), 0, reset)}}},
		}},
		// As the reference: the overall code is OK, each status says what
		// would have been decided.
		{"global shadow mode", Options{ShadowMode: true}, []call{
			{req("web", d("ip=2")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, limit(2, minute), 1, reset)}}},
			{req("web", d("ip=2")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, limit(2, minute), 0, reset)}}},
			{req("web", d("ip=2")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st(over, limit(2, minute), 0, reset)}}},
			{req("web", d("ip=2"), d("shadow=2"), d("shadow=2")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				st(over, limit(2, minute), 0, reset), st(ok, limit(1, minute), 0, reset), st(ok, limit(1, minute), 0, reset)}}},
		}},
		{"several limits report the closest", Options{}, []call{
			{req("web", d("multi=1")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				st(ok, &rlsv3.RateLimitResponse_RateLimit{Name: "hourly", RequestsPerUnit: 3, Unit: rlsv3.RateLimitResponse_RateLimit_HOUR}, 2, time.Hour-10500*time.Millisecond)}}},
		}},
		{"unit multiplier", Options{}, []call{
			{req("web", d("windowed=1")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				st(ok, &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 1, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND, UnitMultiplier: wrapperspb.UInt32(30)}, 0, 19500*time.Millisecond)}}},
		}},
		{"stop increment when over limit", Options{StopIncrementWhenOverLimit: true}, []call{
			{req("web", d("ip=3"), d("ip=3")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				st(ok, limit(2, minute), 1, reset), st(ok, limit(2, minute), 0, reset)}}},
			{req("web", d("ip=4"), d("ip=3")), &rlsv3.RateLimitResponse{OverallCode: over, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				st(ok, limit(2, minute), 2, reset), st(over, limit(2, minute), 0, reset)}}},
			// ip=4 consumed nothing above, so two more fit.
			{req("web", d("ip=4"), d("ip=4")), &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				st(ok, limit(2, minute), 1, reset), st(ok, limit(2, minute), 0, reset)}}},
		}},
		{"override", Options{}, []call{
			{req("web", &rlv3.RateLimitDescriptor{Entries: d("ip=5").Entries, Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_MINUTE}}),
				&rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, limit(7, minute), 6, reset)}}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestServer(t, tc.opts)
			for i, c := range tc.calls {
				got, err := s.ShouldRateLimit(context.Background(), c.req)
				if err != nil {
					t.Fatalf("call %d: ShouldRateLimit() error: %v", i, err)
				}
				if diff := cmp.Diff(c.want, got, protocmp.Transform()); diff != "" {
					t.Errorf("call %d: ShouldRateLimit() mismatch (-want +got):\n%s", i, diff)
				}
			}
		})
	}
}

// TestEmptyDescriptor: a descriptor without entries (Envoy sends one when an
// action found no value) matches nothing and is answered OK, with or
// without an override, and the request's other descriptors are limited, as
// the reference answers.
func TestEmptyDescriptor(t *testing.T) {
	s := newTestServer(t, Options{})
	empty := d()
	withOverride := &rlv3.RateLimitDescriptor{Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_MINUTE}}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := s.ShouldRateLimit(context.Background(), req("web", empty, d("ip=9.9.9.9"), withOverride))
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		st := resp.GetStatuses()
		if resp.GetOverallCode() != want || len(st) != 3 || st[0].GetCode() != rlsv3.RateLimitResponse_OK ||
			st[1].GetCode() != want || st[2].GetCode() != rlsv3.RateLimitResponse_OK || st[0].GetCurrentLimit() != nil || st[2].GetCurrentLimit() != nil {
			t.Errorf("call %d: %v, want %v from ip=9.9.9.9 alone, the empty descriptors OK without a limit", i+1, resp, want)
		}
	}
	resp, err := s.ShouldRateLimit(context.Background(), req("web", d()))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("only an empty descriptor: %v, %v, want OK", resp, err)
	}
}

// TestOverrideWeek: an override's unit 7, WEEK in the response's enum but
// absent from the override's, is a week, as the reference reads it.
func TestOverrideWeek(t *testing.T) {
	s := newTestServer(t, Options{})
	o := &rlv3.RateLimitDescriptor{Entries: d("ip=7.7.7.7").Entries,
		Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit(7)}}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := s.ShouldRateLimit(context.Background(), req("web", o))
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		st := resp.GetStatuses()[0]
		if st.GetCode() != want || st.GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_WEEK ||
			st.GetDurationUntilReset().AsDuration() > 7*24*time.Hour {
			t.Errorf("call %d: %v, want %v, 1 per WEEK", i+1, st, want)
		}
	}
}

func TestShouldRateLimitBadRequests(t *testing.T) {
	s := newTestServer(t, Options{Limits: Limits{MaxDescriptors: 2, MaxEntries: 2, MaxStringBytes: 8, MaxHits: 100, MaxKeys: 2}})
	heavy := d("ip=1")
	heavy.HitsAddend = wrapperspb.UInt64(math.MaxUint64)
	tests := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{"nil request", nil, "domain is empty"},
		{"empty domain", req("", d("ip=1")), "domain is empty"},
		{"long domain", req("123456789", d("ip=1")), "domain is 9 bytes long, at most 8 allowed"},
		{"no descriptors", req("web"), "no descriptors"},
		{"too many descriptors", req("web", d("a=1"), d("a=1"), d("a=1")), "3 descriptors, at most 2 allowed"},
		{"too many entries", req("web", d("a=1", "b=2", "c=3")), "descriptors[0] has 3 entries, at most 2 allowed"},
		{"empty key", req("web", d("ip=1"), d("=1")), "descriptors[1].entries[0].key is empty"},
		{"long key", req("web", d("123456789=1")), "descriptors[0].entries[0].key is 9 bytes long, at most 8 allowed"},
		{"hits past REQUEST_MAX_HITS", req("web", heavy), "descriptors[0].hits_addend is 18446744073709551615, at most 100 allowed (REQUEST_MAX_HITS)"},
		{"keys past REQUEST_MAX_KEYS", req("web", d("multi=1"), d("ip=2")), "the descriptors match 3 limits (store keys), at most 2 allowed (REQUEST_MAX_KEYS)"},
		{"override unknown unit", req("web", &rlv3.RateLimitDescriptor{Entries: d("ip=1").Entries, Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}}), "descriptors[0].limit.unit is UNKNOWN"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.ShouldRateLimit(context.Background(), tc.req)
			if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != tc.want {
				t.Errorf("ShouldRateLimit() error = %v, want InvalidArgument %q", err, tc.want)
			}
		})
	}
}

// A value over MaxStringBytes is what a client controls (a header, the
// path): refusing it would make Envoy fall back to its failure mode and let
// the request through, so it is matched and counted like any other, and it
// reaches counter keys and metric names only hashed.
func TestLongValuesAreCounted(t *testing.T) {
	reg := metrics.New(metrics.Options{})
	s := newTestServer(t, Options{Limits: Limits{MaxStringBytes: 8}, Metrics: reg})
	long, other := strings.Repeat("1", 300), strings.Repeat("2", 300)
	codes := func(descs ...*rlv3.RateLimitDescriptor) []rlsv3.RateLimitResponse_Code {
		t.Helper()
		var got []rlsv3.RateLimitResponse_Code
		for _, dd := range descs {
			resp, err := s.ShouldRateLimit(context.Background(), req("web", dd))
			if err != nil {
				t.Fatalf("ShouldRateLimit(%.20s...): %v", dd.GetEntries()[0].GetValue(), err)
			}
			got = append(got, resp.GetOverallCode())
		}
		return got
	}
	// 2 per minute, per value.
	if got, want := codes(d("ip="+long), d("ip="+long), d("ip="+long), d("ip="+other)), []rlsv3.RateLimitResponse_Code{ok, ok, over, ok}; !slices.Equal(got, want) {
		t.Errorf("ip codes = %v, want %v: each long value counted on its own", got, want)
	}
	// A wildcard rule (1 per minute for /api/*) still matches a padded path.
	padded := "/api/" + strings.Repeat("x", 5000)
	if got, want := codes(d("path="+padded), d("path="+padded+"y")), []rlsv3.RateLimitResponse_Code{ok, over}; !slices.Equal(got, want) {
		t.Errorf("path codes = %v, want %v: the /api/* rule must hold for long paths", got, want)
	}
	// detailed_metric names series by value: a long value only hashed.
	if _, err := s.ShouldRateLimit(context.Background(), req("web", d("detailed="+long))); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(scrape(t, reg), "\n") {
		if strings.HasPrefix(line, "ratelimit_service_rate_limit_total_hits") && len(line) > 300 {
			t.Errorf("a metric series holds the long value: %.120s...", line)
		}
	}
}

type failingStore struct{}

func (failingStore) Apply(context.Context, limiter.Batch) ([]limiter.Outcome, error) {
	return nil, errors.New("connection refused")
}

func TestStoreFailureIsUnavailable(t *testing.T) {
	s := newTestServer(t, Options{Store: failingStore{}})
	_, err := s.ShouldRateLimit(context.Background(), req("web", d("ip=1")))
	if status.Code(err) != codes.Unavailable || strings.Contains(err.Error(), "connection refused") {
		t.Errorf("ShouldRateLimit() with a failing store: error = %v, want Unavailable without the store's own error", err)
	}
	// No hit, no store call: an unmatched request succeeds even so.
	if _, err := s.ShouldRateLimit(context.Background(), req("web", d("nope=1"))); err != nil {
		t.Errorf("ShouldRateLimit(unmatched) with a failing store: error = %v, want nil", err)
	}
}

func TestNoConfigIsUnavailable(t *testing.T) {
	var none atomic.Pointer[config.Config]
	s, err := New(Options{Store: failingStore{}, Configs: &none})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.ShouldRateLimit(context.Background(), req("web", d("ip=1")))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "no rate limit configuration") {
		t.Errorf("ShouldRateLimit() without config: error = %v, want Unavailable", err)
	}
}

func TestJSONHandler(t *testing.T) {
	s := newTestServer(t, Options{})
	h := s.JSONHandler(JSONOptions{})
	tests := []struct {
		name, method, body string
		wantCode           int
		wantBody           string
	}{
		{"ok", "POST", `{"domain":"web","descriptors":[{"entries":[{"key":"ip","value":"9"}]}]}`, 200, `"overallCode":"OK"`},
		{"ok again", "POST", `{"domain":"web","descriptors":[{"entries":[{"key":"ip","value":"9"}]}]}`, 200, `"durationUntilReset":"49.500s"`},
		{"over", "POST", `{"domain":"web","descriptors":[{"entries":[{"key":"ip","value":"9"}]}]}`, 429, `"overallCode":"OVER_LIMIT"`},
		{"bad json", "POST", `{"domain":`, 400, "invalid RateLimitRequest JSON"},
		{"unknown field", "POST", `{"domain":"web","nope":1}`, 400, "invalid RateLimitRequest JSON"},
		{"invalid request", "POST", `{"domain":"web"}`, 400, "no descriptors"},
		{"wrong method", "GET", ``, 405, "POST"},
	}
	for _, tc := range tests {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tc.method, "/json", strings.NewReader(tc.body)))
		if rec.Code != tc.wantCode || !strings.Contains(rec.Body.String(), tc.wantBody) {
			t.Errorf("%s: POST /json = %d %q, want %d containing %q", tc.name, rec.Code, rec.Body.String(), tc.wantCode, tc.wantBody)
		}
	}
	rec := httptest.NewRecorder()
	NewStoreFailing(t).JSONHandler(JSONOptions{}).ServeHTTP(rec, httptest.NewRequest("POST", "/json", strings.NewReader(`{"domain":"web","descriptors":[{"entries":[{"key":"ip","value":"9"}]}]}`)))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("POST /json with a failing store = %d, want 503", rec.Code)
	}
}

func NewStoreFailing(t *testing.T) *Server { return newTestServer(t, Options{Store: failingStore{}}) }

func BenchmarkShouldRateLimit(b *testing.B) {
	f, _ := config.Parse("b.yaml", []byte(testConfig))
	cfg, _ := config.Build([]*config.File{f}, config.Options{})
	var cur atomic.Pointer[config.Config]
	cur.Store(cfg)
	mem := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
	defer mem.Close()
	s, _ := New(Options{Store: mem, Configs: &cur})
	r := req("web", d("multi=1"))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.ShouldRateLimit(context.Background(), r); err != nil {
			b.Fatal(err)
		}
	}
}

func quietLogger() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// countStore counts the batches it is asked to apply.
type countStore struct {
	limiter.Store
	calls atomic.Int64
}

func (c *countStore) Apply(ctx context.Context, b limiter.Batch) ([]limiter.Outcome, error) {
	c.calls.Add(1)
	return c.Store.Apply(ctx, b)
}

// TestCancelledCallMakesNoDecision: a call whose client already cancelled
// it (a reset stream) costs no store call and counts no hit; it is counted
// as cancelled.
func TestCancelledCallMakesNoDecision(t *testing.T) {
	mem := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
	t.Cleanup(mem.Close)
	store := &countStore{Store: mem}
	reg := metrics.New(metrics.Options{})
	s := newTestServer(t, Options{Store: store, Metrics: reg})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.ShouldRateLimit(ctx, req("web", d("ip=9"))); status.Code(err) != codes.Canceled {
		t.Errorf("cancelled call = %v, want Canceled", err)
	}
	if n := store.calls.Load(); n != 0 {
		t.Errorf("the store was called %d times for a cancelled call", n)
	}
	resp, err := s.ShouldRateLimit(context.Background(), req("web", d("ip=9")))
	if err != nil || resp.GetStatuses()[0].GetLimitRemaining() != 1 {
		t.Errorf("the next call = %v, %v: want the first hit on ip=9 (limit 2, 1 left)", resp, err)
	}
	rec := httptest.NewRecorder()
	reg.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), "ratelimit_requests_cancelled_total 1") {
		t.Error("the cancelled call is not counted in ratelimit_requests_cancelled_total")
	}
}

// TestDebugLogsEachDecision: at debug level each descriptor's decision is
// one line (entries, the rule with file and line, each limit's store key
// and decision); at any other level nothing per request is logged.
func TestDebugLogsEachDecision(t *testing.T) {
	for _, level := range []logrus.Level{logrus.DebugLevel, logrus.InfoLevel} {
		var buf strings.Builder
		log := logrus.New()
		log.SetOutput(&buf)
		log.SetLevel(level)
		s := newTestServer(t, Options{})
		s.opts.Logger, s.debug = log, debugEnabled(log)
		for range 3 {
			if _, err := s.ShouldRateLimit(context.Background(), req("web", d("ip=7"), d("nope=x"))); err != nil {
				t.Fatal(err)
			}
		}
		out := buf.String()
		if level != logrus.DebugLevel {
			if out != "" {
				t.Errorf("at %s, per-request lines were logged:\n%s", level, out)
			}
			continue
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 6 {
			t.Fatalf("%d lines for 3 requests of 2 descriptors, want 6:\n%s", len(lines), out)
		}
		for _, want := range []string{`descriptor="ip=7"`, `rule="ip (test.yaml:`, `2 per minute, fixed_window key=`, "OVER_LIMIT remaining=0", `descriptor="nope=x"`, "rule=none"} {
			if !strings.Contains(out, want) {
				t.Errorf("debug lines lack %q:\n%s", want, out)
			}
		}
	}
}

// BenchmarkShouldRateLimitLogLevels: what the per-decision debug line
// costs when it is off (the default) and when it is on.
func BenchmarkShouldRateLimitLogLevels(b *testing.B) {
	for _, level := range []logrus.Level{logrus.InfoLevel, logrus.DebugLevel} {
		b.Run(level.String(), func(b *testing.B) {
			log := logrus.New()
			log.SetOutput(io.Discard)
			log.SetLevel(level)
			s := newTestServer(b, Options{})
			s.opts.Logger, s.debug = log, debugEnabled(log)
			r := req("web", d("multi=1"))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.ShouldRateLimit(context.Background(), r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
