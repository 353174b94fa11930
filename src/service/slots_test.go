package service

import (
	"context"
	"maps"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
)

const slotsConfig = `
domain: jobs
descriptors:
  - key: job
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: concurrency}
  - key: cap
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// slotDesc is kv with hits_addend n, a release when release is set.
func slotDesc(kv string, n uint64, release bool) *rlv3.RateLimitDescriptor {
	desc := d(kv)
	desc.HitsAddend = wrapperspb.UInt64(n)
	desc.IsNegativeHits = release
	return desc
}

// slotsOf is the slotsTaken field of an answer, "" for none, by index.
func slotsOf(t *testing.T, s *Server, descs ...*rlv3.RateLimitDescriptor) map[string]string {
	t.Helper()
	resp, err := s.ShouldRateLimit(context.Background(), req("jobs", descs...))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for k, v := range resp.GetDynamicMetadata().GetFields()[slotsField].GetStructValue().GetFields() {
		got[k] = v.GetStringValue()
	}
	return got
}

// TestSlotsTakenAreNamedForTheRelease: the dynamic metadata names the
// slots a request took, and only those: nothing for a refusal, a
// release, a take that STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT did not
// write, or an answer of the failure policy.
func TestSlotsTakenAreNamedForTheRelease(t *testing.T) {
	newServer := func(o Options) *Server {
		if o.Store == nil {
			mem := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
			t.Cleanup(mem.Close)
			o.Store = mem
		}
		o.Configs, o.Logger = configs(t, "jobs.yaml", slotsConfig), quietLogger()
		s, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	type step struct {
		descs []*rlv3.RateLimitDescriptor
		want  map[string]string
	}
	for _, tc := range []struct {
		name  string
		opts  Options
		steps []step
	}{
		{"take, refuse, release", Options{}, []step{
			{[]*rlv3.RateLimitDescriptor{slotDesc("job=a", 2, false)}, map[string]string{"0": "2"}},
			{[]*rlv3.RateLimitDescriptor{slotDesc("job=a", 1, false)}, map[string]string{}},
			{[]*rlv3.RateLimitDescriptor{slotDesc("job=a", 2, true)}, map[string]string{}},
			{[]*rlv3.RateLimitDescriptor{d("cap=c"), slotDesc("job=a", 1, false)}, map[string]string{"1": "1"}},
		}},
		{"a rejection beside it writes nothing", Options{StopIncrementWhenOverLimit: true}, []step{
			{[]*rlv3.RateLimitDescriptor{d("cap=c")}, map[string]string{}},
			{[]*rlv3.RateLimitDescriptor{slotDesc("job=b", 1, false), d("cap=c")}, map[string]string{}},
			// Nothing was taken: both slots are still free.
			{[]*rlv3.RateLimitDescriptor{slotDesc("job=b", 2, false)}, map[string]string{"0": "2"}},
		}},
		{"the failure policy takes nothing", Options{Store: failingStore{}, FailurePolicy: config.PolicyAllow}, []step{
			{[]*rlv3.RateLimitDescriptor{slotDesc("job=c", 1, false)}, map[string]string{}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(tc.opts)
			for i, st := range tc.steps {
				if got := slotsOf(t, s, st.descs...); !maps.Equal(got, st.want) {
					t.Errorf("step %d: slotsTaken %v, want %v", i, got, st.want)
				}
			}
		})
	}
}
