package rlqs_test

import (
	"sync"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/rlqs"
	"github.com/openrls/ratelimit/src/rlqs/rlqstest"
)

// TestTenEnvoysOnALongerWindow: ten fake Envoys, half modelling Envoy
// 1.40 and half following the API's text (the domain on the first
// message only, exact time_elapsed, no expiry without a TTL), share a
// limit of 100 per 10-second window (unit_multiplier), each asking for 3
// requests a second: no aligned window admits more than 100.
func TestTenEnvoysOnALongerWindow(t *testing.T) {
	t.Parallel()
	cfg := load(t, `
domain: fleet
descriptors:
  - key: tenant
    value: a
    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 100}
`)
	conn := serve(t, rlqs.Options{Configs: cfg})
	adm := rlqstest.Admissions{Window: 10 * time.Second}
	id := map[string]string{"tenant": "a"}
	var wg sync.WaitGroup
	for i := range 10 {
		profile := rlqstest.Envoy140
		if i%2 == 1 {
			profile = rlqstest.API
		}
		e := rlqstest.Start(rlqstest.Options{Conn: conn, Domain: "fleet", Profile: profile, Report: time.Second,
			NoAssignment: rlqstest.Deny, OnAdmit: adm.Add})
		defer e.Stop()
		wg.Add(1)
		go func() { defer wg.Done(); drive(e, id, 3, 22*time.Second) }()
	}
	wg.Wait()
	per := adm.Snapshot()
	total := 0
	for w, n := range per {
		total += n
		if n > 100 {
			t.Errorf("the 10 s window starting at %d admitted %d, past 100 (all: %v)", w*10, n, per)
		}
	}
	if total == 0 {
		t.Fatal("nothing was admitted")
	}
	t.Logf("admitted per 10 s window: %v", per)
}
