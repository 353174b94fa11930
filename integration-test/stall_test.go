package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// stallConfig: a per-second fixed window, decided by Redis's plain
// commands once they are ready.
const stallConfig = `
domain: stall
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1000}
`

// stallValues is how many keys each round hits.
const stallValues = 20

// TestNoKeyWithoutATTLAfterRedisStalls stalls Redis (SIGSTOP) past
// REDIS_TIMEOUT while hits on keys the binary has just counted are on
// their way, and resumes it after their window has ended: Redis then runs
// every transaction the binary gave up on, on keys that have expired. No
// key may be left without a TTL. (Sent as an INCRBY alone, a known key's
// hit made its key again without one, for good.)
func TestNoKeyWithoutATTLAfterRedisStalls(t *testing.T) {
	srv := redistest.Start(t)
	env := writeConfig(t, map[string]string{"stall.yaml": stallConfig})
	// No circuit breaker: every late hit is sent, none answered for it.
	env["REDIS_URL"], env["REDIS_TIMEOUT"], env["CIRCUIT_BREAKER_FAILURES"] = srv.Addr, "200ms", "0"
	p := start(t, env)
	value := func(round, i int) *rlv3.RateLimitDescriptor {
		return configtest.Desc(fmt.Sprintf("k=r%d-%d", round, i))
	}
	late := func(round int) {
		var wg sync.WaitGroup
		for i := range stallValues {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				// While Redis is stopped the call fails (or the failure
				// policy answers it): what matters is what Redis does later.
				_, _ = p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "stall",
					Descriptors: descs(value(round, i))})
			})
		}
		wg.Wait()
	}
	incrbys := func() int {
		st, err := srv.CommandStats()
		if err != nil {
			t.Fatal(err)
		}
		return st["incrby"].Calls
	}
	// The plain route serves once its probe has passed.
	eventually(t, "the plain route counts hits (INCRBY)", func() bool {
		p.should(t, "stall", configtest.Desc("k=warm"))
		return incrbys() > 0
	})
	for round := range 5 {
		start := time.Now()
		for i := range stallValues { // the keys of this second, counted: known to the binary
			p.should(t, "stall", value(round, i))
		}
		before := incrbys()
		srv.Pause()
		late(round) // on their way while Redis is stopped
		if time.Now().Truncate(time.Second) != start.Truncate(time.Second) {
			srv.Resume()
			continue // the second ended before the late hits were sent: again
		}
		// The stall itself: until well past the window's end.
		time.Sleep(time.Until(start.Truncate(time.Second).Add(1500 * time.Millisecond)))
		srv.Resume()
		// A command on a new connection runs after those already waiting.
		if _, err := srv.Do("PING"); err != nil {
			t.Fatal(err)
		}
		// The batcher sends what it has queued in one transaction and
		// fails the rest at their deadline: one late hit at least.
		if got := incrbys() - before; got == 0 {
			t.Logf("round %d: none of the %d late hits reached Redis as plain commands", round, stallValues)
			continue
		}
		var noTTL []string
		for _, k := range scanKeys(t, srv, "*") {
			out, err := srv.Do("PTTL", k)
			if err != nil {
				t.Fatal(err)
			}
			if ms, _ := strconv.ParseInt(strings.TrimSpace(out), 10, 64); ms == -1 {
				noTTL = append(noTTL, k)
			}
		}
		if len(noTTL) > 0 {
			t.Fatalf("after a stall past REDIS_TIMEOUT, %d keys have no TTL: %q", len(noTTL), noTTL)
		}
		return
	}
	t.Fatal("no round sent its late hits as plain commands within one second")
}
