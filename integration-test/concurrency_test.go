package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/memcache/memcachedtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// concurrencyConfig holds 3 slots per export: one held at most a minute
// (long enough that no caller, however slow the machine, outlives it)
// and one held at most 3 seconds (for a release that never comes).
const concurrencyConfig = `
domain: jobs
descriptors:
  - key: export
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: concurrency}
  - key: brief
    rate_limit: {unit: second, unit_multiplier: 3, requests_per_unit: 3, algorithm: concurrency}
`

// slot takes (or with release, gives back) one slot of key=value, as
// Envoy's request-path action and its apply_on_stream_done twin send it.
func slot(t testing.TB, p *proc, kv string, release bool) *rlsv3.RateLimitResponse {
	t.Helper()
	r, err := sendSlot(p, kv, release)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestConcurrencySlotsThroughTheBinary: on every store, three service
// processes (one on the embedded store, which is not shared) hold at
// most 3 slots between them: the 4th take is refused, a release lets one
// more in, a slot never released is freed by itself after its hold
// bound, and 50 callers taking and releasing at once never hold more
// than 3, and leave all 3 free when done.
func TestConcurrencySlotsThroughTheBinary(t *testing.T) {
	for _, tc := range []struct {
		name  string
		procs int
		env   func(t *testing.T) map[string]string
	}{
		{"memory", 1, func(t *testing.T) map[string]string { return map[string]string{} }},
		{"redis", 3, func(t *testing.T) map[string]string { return map[string]string{"REDIS_URL": redistest.Start(t).Addr} }},
		{"sentinel", 3, func(t *testing.T) map[string]string {
			st := redistest.StartSentinel(t)
			return map[string]string{"REDIS_TYPE": "sentinel", "REDIS_URL": st.MasterName + "," + strings.Join(st.SentinelAddrs(), ",")}
		}},
		{"cluster", 3, func(t *testing.T) map[string]string {
			nodes := redistest.StartCluster(t, 3)
			return map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": nodes[0].Addr + "," + nodes[1].Addr}
		}},
		{"memcache", 3, func(t *testing.T) map[string]string {
			return map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": memcachedtest.Start(t).Addr}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := writeConfig(t, map[string]string{"jobs.yaml": concurrencyConfig})
			for k, v := range tc.env(t) {
				env[k] = v
			}
			var procs []*proc
			for range tc.procs {
				procs = append(procs, start(t, env))
			}
			takeReleaseTake(t, procs)
			lostReleaseExpires(t, procs)
			neverMoreThanThree(t, procs)
		})
	}
}

// slotsTaken is what the answer's dynamic metadata says descriptor 0
// took, the hits_addend of its release in examples/envoy-concurrency.yaml.
func slotsTaken(r *rlsv3.RateLimitResponse) string {
	return r.GetDynamicMetadata().GetFields()["slotsTaken"].GetStructValue().GetFields()["0"].GetStringValue()
}

// at is the i-th process, round the list: calls spread over replicas.
func at(procs []*proc, i int) *proc { return procs[i%len(procs)] }

func takeReleaseTake(t *testing.T, procs []*proc) {
	for i := range 3 {
		r := slot(t, at(procs, i), "export=a", false)
		if r.OverallCode != rlsv3.RateLimitResponse_OK || slotsTaken(r) != "1" {
			t.Fatalf("take %d of 3: %v, slotsTaken %q; want OK, 1", i+1, r.OverallCode, slotsTaken(r))
		}
	}
	r := slot(t, at(procs, 3), "export=a", false)
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].LimitRemaining != 0 || slotsTaken(r) != "" {
		t.Fatalf("the 4th take: %v, %d free, slotsTaken %q; want OVER_LIMIT, none free, none taken", r.OverallCode, r.Statuses[0].LimitRemaining, slotsTaken(r))
	}
	if r := slot(t, at(procs, 4), "export=a", true); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("a release: %v, %d free; want OK, 1 free", r.OverallCode, r.Statuses[0].LimitRemaining)
	}
	if r := slot(t, at(procs, 5), "export=a", false); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a take after the release: %v", r.OverallCode)
	}
	if r := slot(t, at(procs, 6), "export=a", false); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a take past 3 again: %v", r.OverallCode)
	}
}

// lostReleaseExpires takes every slot of a 3 s bound and never gives
// them back: they free themselves.
func lostReleaseExpires(t *testing.T, procs []*proc) {
	began := time.Now()
	for i := range 3 {
		if r := slot(t, at(procs, i), "brief=b", false); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("take %d of 3: %v", i+1, r.OverallCode)
		}
	}
	r := slot(t, at(procs, 3), "brief=b", false)
	// A machine too busy to make four calls in 3 s has seen the first slot
	// freed already: only then is an OK right.
	if time.Since(began) < 3*time.Second {
		if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("the 4th take within the hold bound: %v, want OVER_LIMIT", r.OverallCode)
		}
		if reset := r.Statuses[0].DurationUntilReset.AsDuration(); reset <= 0 || reset > 3*time.Second {
			t.Errorf("duration_until_reset %v, want when the oldest slot is freed: within its 3 s bound", reset)
		}
	}
	eventually(t, "a slot never released freed by its hold bound", func() bool {
		return slot(t, at(procs, 4), "brief=b", false).OverallCode == rlsv3.RateLimitResponse_OK
	})
}

// neverMoreThanThree runs 50 callers, each taking a slot, holding it
// while it counts itself in flight, and giving it back, 20 times. A
// caller counts itself out before its release is sent, so the store
// holds at least as many slots as are counted in flight.
func neverMoreThanThree(t *testing.T, procs []*proc) {
	const callers, rounds = 50, 20
	var inFlight, most, served atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := at(procs, c)
			for range rounds {
				take, err := hammerSlot(p, false)
				if err != nil {
					errs <- err
					return
				}
				if take.OverallCode != rlsv3.RateLimitResponse_OK {
					continue
				}
				n := inFlight.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				served.Add(1)
				time.Sleep(2 * time.Millisecond) // the request's work, its slot held
				inFlight.Add(-1)                 // before the release: the store holds at least as many
				if _, err := hammerSlot(at(procs, c+1), true); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d callers × %d takes: %d served, at most %d in flight", callers, rounds, served.Load(), most.Load())
	if most.Load() > 3 || served.Load() == 0 {
		t.Fatalf("at most %d in flight over %d served, want at most 3 and some", most.Load(), served.Load())
	}
	// Every slot came back: 3 free, no more.
	takeThreeRefuseFourth(t, procs, "export=hammer")
}

// hammerSlot takes or releases a slot of export=hammer.
func hammerSlot(p *proc, release bool) (*rlsv3.RateLimitResponse, error) {
	return sendSlot(p, "export=hammer", release)
}

// sendSlot is slot for a goroutine: the error returned, not fatal.
func sendSlot(p *proc, kv string, release bool) (*rlsv3.RateLimitResponse, error) {
	d := configtest.Desc(kv)
	d.HitsAddend = wrapperspb.UInt64(1)
	d.IsNegativeHits = release
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "jobs", Descriptors: descs(d)})
	if err != nil {
		return nil, fmt.Errorf("release %v: %w", release, err)
	}
	return r, nil
}

func takeThreeRefuseFourth(t *testing.T, procs []*proc, kv string) {
	t.Helper()
	for i := range 4 {
		want := rlsv3.RateLimitResponse_OK
		if i == 3 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if r := slot(t, at(procs, i), kv, false); r.OverallCode != want {
			t.Fatalf("after the callers, take %d: %v, want %v", i+1, r.OverallCode, want)
		}
	}
}
