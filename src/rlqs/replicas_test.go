package rlqs_test

import (
	"sync"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/rlqs"
	"github.com/openrls/ratelimit/src/rlqs/rlqstest"
)

// TestReplicasShareOneLimit: two services on one store, a fake Envoy on
// each, demands of 25 per second each against 30: no second over 30.
func TestReplicasShareOneLimit(t *testing.T) {
	t.Parallel()
	store := limiter.NewMemoryStore(limiter.MemoryOptions{})
	cfg := load(t, fleetConfig)
	var adm rlqstest.Admissions
	id := map[string]string{"tenant": "a"}
	start := time.Now()
	var wg sync.WaitGroup
	for range 2 {
		conn := serve(t, rlqs.Options{Configs: cfg, Store: store})
		e := rlqstest.Start(rlqstest.Options{Conn: conn, Domain: "fleet", Report: time.Second,
			NoAssignment: rlqstest.Deny, OnAdmit: adm.Add})
		defer e.Stop()
		wg.Add(1)
		go func() { defer wg.Done(); drive(e, id, 25, 12*time.Second) }()
	}
	wg.Wait()
	per := adm.Snapshot()
	for sec, n := range per {
		if n > 30 {
			t.Errorf("second %d admitted %d across two replicas, past 30 (all: %v)", sec-start.Unix(), n, per)
		}
	}
	t.Logf("%v", per)
}
