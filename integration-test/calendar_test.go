package integration

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/memcache/memcachedtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// calendarConfig has a daily quota on the calendar of a zone 14 hours
// ahead of UTC, and monthly quotas on UTC's calendar, one per window
// algorithm.
const calendarConfig = `
domain: quota
descriptors:
  - key: daily
    rate_limit: {unit: day, requests_per_unit: 1000, calendar: Pacific/Kiritimati}
  - key: monthly
    rate_limit: {unit: month, requests_per_unit: 100000, calendar: UTC}
  - key: monthly_sliding
    rate_limit: {unit: month, requests_per_unit: 100000, calendar: UTC, algorithm: sliding_window}
`

// TestCalendarQuotasThroughTheBinary: on every store, a day rule in
// Pacific/Kiritimati answers duration_until_reset up to that zone's next
// midnight, and a month rule up to the next 1st at midnight UTC (not 30
// days from an epoch-aligned start, as a plain month is); a sliding one
// until its hits have aged out, the 1st after that.
func TestCalendarQuotasThroughTheBinary(t *testing.T) {
	kiritimati, err := time.LoadLocation("Pacific/Kiritimati")
	if err != nil {
		t.Fatal(err)
	}
	nextMidnight := func(t time.Time) time.Time {
		y, m, d := t.In(kiritimati).Date()
		return time.Date(y, m, d+1, 0, 0, 0, 0, kiritimati)
	}
	nextFirst := func(t time.Time) time.Time {
		y, m, _ := t.UTC().Date()
		return time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC)
	}
	for _, tc := range []struct {
		name string
		env  func(t *testing.T) map[string]string
	}{
		{"memory", func(t *testing.T) map[string]string { return map[string]string{} }},
		{"redis", func(t *testing.T) map[string]string { return map[string]string{"REDIS_URL": redistest.Start(t).Addr} }},
		{"redis function only", func(t *testing.T) map[string]string {
			return map[string]string{"REDIS_URL": redistest.Start(t).Addr, "REJECTED_HITS": "drop"}
		}},
		{"cluster", func(t *testing.T) map[string]string {
			nodes := redistest.StartCluster(t, 3)
			return map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": nodes[0].Addr + "," + nodes[1].Addr}
		}},
		{"memcache", func(t *testing.T) map[string]string {
			return map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": memcachedtest.Start(t).Addr}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := writeConfig(t, map[string]string{"quota.yaml": calendarConfig})
			for k, v := range tc.env(t) {
				env[k] = v
			}
			p := start(t, env)
			for _, c := range []struct {
				kv   string
				next func(time.Time) time.Time
			}{{"daily=t", nextMidnight}, {"monthly=t", nextFirst},
				// A sliding window's hits age out over the month after theirs.
				{"monthly_sliding=t", func(t time.Time) time.Time { return nextFirst(nextFirst(t)) }}} {
				before := time.Now()
				r := p.should(t, "quota", configtest.Desc(c.kv))
				after := time.Now()
				if r.OverallCode != rlsv3.RateLimitResponse_OK {
					t.Fatalf("%s: %v", c.kv, r.OverallCode)
				}
				if !c.next(before).Equal(c.next(after)) {
					continue // the call straddled a reset: either answer is right
				}
				reset := r.Statuses[0].DurationUntilReset.AsDuration()
				want := c.next(after)
				// The answer is whole seconds, rounded either way.
				if lo, hi := want.Sub(after)-time.Second, want.Sub(before)+time.Second; reset < lo || reset > hi {
					t.Errorf("%s: duration_until_reset %v, want the time until %v (between %v and %v)", c.kv, reset, want, lo, hi)
				}
			}
		})
	}
}
