package integration

import (
	"math"
	"strconv"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/memcache/memcachedtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// retryConfig has one rule per algorithm, each of an hour, so that no
// test's pace can refill or age anything out between its hits.
const retryConfig = `
domain: retry
descriptors:
  - key: fixed
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: sliding_window}
  - key: bucket
    rate_limit: {unit: hour, requests_per_unit: 6, algorithm: token_bucket}
  - key: log
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: sliding_log}
`

// TestDurationUntilResetIsTheWaitForTheNextAdmission runs the binary on
// each store (embedded, Redis, memcache), spends each algorithm's limit and reads the rejected status:
// duration_until_reset (and the RateLimit-Reset header beside it) is how
// long until a request like it could pass, not until the counter is empty.
// A token bucket of 6 an hour gets a token every 10 minutes (the old answer:
// the hour until the bucket is full); a sliding window of 2 an hour admits
// again once the window just filled weighs half (the old answer: until both
// windows aged out, about half an hour later). The fixed window and the sliding
// log were right already and are held to it.
func TestDurationUntilResetIsTheWaitForTheNextAdmission(t *testing.T) {
	const p = time.Hour
	stores := map[string]func(t *testing.T) map[string]string{
		"embedded": func(t *testing.T) map[string]string { return map[string]string{} },
		"redis":    func(t *testing.T) map[string]string { return map[string]string{"REDIS_URL": redistest.Start(t).Addr} },
		"memcache": func(t *testing.T) map[string]string {
			return map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": memcachedtest.Start(t).Addr}
		},
	}
	for name, storeEnv := range stores {
		t.Run(name, func(t *testing.T) {
			env := writeConfig(t, map[string]string{"retry.yaml": retryConfig})
			env["LIMIT_RESPONSE_HEADERS_ENABLED"] = "true"
			for k, v := range storeEnv(t) {
				env[k] = v
			}
			proc := start(t, env)
			cases := []struct {
				key   string
				hits  int
				check func(d time.Duration, first, firstGot, sent, got time.Time) string
			}{
				{"fixed", 2, func(d time.Duration, _, _, sent, got time.Time) string {
					// Until the window ends: d + elapsed is the period.
					return within(d, p-sinceWindow(got, p), p-sinceWindow(sent, p))
				}},
				{"sliding", 2, func(d time.Duration, first, _, sent, got time.Time) string {
					// The two hits fill the window; a third fits once that
					// window, become the previous one, weighs at most half
					// (its weight is in thousandths, rounded down: 0.5 from
					// the first millisecond past 0.499 of the next window).
					half := p*499/1000 + time.Millisecond
					if windowOf(first, p) != windowOf(sent, p) {
						return within(d, half-sinceWindow(got, p), half-sinceWindow(sent, p))
					}
					return within(d, p+half-sinceWindow(got, p), p+half-sinceWindow(sent, p))
				}},
				{"bucket", 6, func(d time.Duration, first, firstGot, sent, got time.Time) string {
					// The next token: ten minutes after the first hit, which
					// the server counted between first and firstGot.
					return within(d, p/6-got.Sub(first), p/6-sent.Sub(firstGot))
				}},
				{"log", 2, func(d time.Duration, first, firstGot, sent, got time.Time) string {
					// The oldest hit leaves the window.
					return within(d, p-got.Sub(first), p-sent.Sub(firstGot))
				}},
			}
			for _, c := range cases {
				t.Run(c.key, func(t *testing.T) {
					desc := configtest.Desc(c.key + "=" + name)
					first, firstGot := time.Now(), time.Time{}
					for i := 0; i < c.hits; i++ {
						if got := proc.should(t, "retry", desc).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
							t.Fatalf("hit %d of %d: %v, want OK", i+1, c.hits, got)
						}
						if i == 0 {
							firstGot = time.Now()
						}
					}
					// A check that straddles a window's edge cannot be
					// placed in either; it is asked again (a rejected hit of
					// these rules counts nothing that matters here).
					for attempt := 0; ; attempt++ {
						sent := time.Now()
						resp := proc.should(t, "retry", desc)
						got := time.Now()
						if windowOf(sent, p) != windowOf(got, p) && attempt < 3 {
							continue
						}
						st := resp.GetStatuses()[0]
						if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
							t.Fatalf("hit %d: %v, want OVER_LIMIT", c.hits+1, st.GetCode())
						}
						d := st.GetDurationUntilReset().AsDuration()
						if msg := c.check(d, first, firstGot, sent, got); msg != "" {
							t.Errorf("duration_until_reset %v: %s", d, msg)
						}
						reset, retry := "", ""
						for _, h := range resp.GetResponseHeadersToAdd() {
							switch h.GetKey() {
							case "RateLimit-Reset":
								reset = h.GetValue()
							case "Retry-After":
								retry = h.GetValue()
							}
						}
						want := strconv.FormatInt(int64(math.Ceil(d.Seconds())), 10)
						if reset != want || retry != want {
							t.Errorf("RateLimit-Reset %q, Retry-After %q; want both %q (duration_until_reset %v, rounded up)", reset, retry, want, d)
						}
						return
					}
				})
			}
		})
	}
}

func windowOf(t time.Time, p time.Duration) int64 { return t.UnixNano() / int64(p) }

func sinceWindow(t time.Time, p time.Duration) time.Duration {
	return time.Duration(t.UnixNano() % int64(p))
}

// within says what is wrong with d, a wait the server computed at some
// instant between the test's send and receive and rounded up to the
// millisecond, against the waits lo (computed at receive) and hi (at send);
// "" when it fits.
func within(d, lo, hi time.Duration) string {
	if d <= lo-time.Millisecond || d > hi+time.Millisecond {
		return "want between " + lo.String() + " and " + hi.String()
	}
	return ""
}
