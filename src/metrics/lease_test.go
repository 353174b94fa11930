package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
)

// Two Redis stores (REDIS_PERSECOND) each export their leases: the second
// must neither panic nor hide the first.
func TestLeasesFromTwoStores(t *testing.T) {
	r := New(Options{})
	r.Leases("main", func() map[string]LeaseStat { return map[string]LeaseStat{"d.k": {Slices: 2, Held: 5}} })
	r.Leases("per_second", func() map[string]LeaseStat { return map[string]LeaseStat{"d.s": {Slices: 7}} })
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		`ratelimit_lease_slices_total{redis="main",rule="d.k"} 2`,
		`ratelimit_lease_held_hits{redis="main",rule="d.k"} 5`,
		`ratelimit_lease_slices_total{redis="per_second",rule="d.s"} 7`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
