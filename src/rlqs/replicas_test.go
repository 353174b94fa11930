package rlqs_test

import (
	"encoding/json"
	"net/http/httptest"
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

// TestAKilledEnvoy: two Envoys asking 25 a second each on a limit of 30;
// one is killed midway (its stream cancelled, its requests stopped). The
// service forgets its stream, and no second passes 30, before or after:
// what the dead Envoy was granted stays held until it would have expired.
func TestAKilledEnvoy(t *testing.T) {
	t.Parallel()
	conn, svc := serveService(t, rlqs.Options{Configs: load(t, fleetConfig)})
	var adm, survivor rlqstest.Admissions
	id := map[string]string{"tenant": "a"}
	start := time.Now()
	dead := rlqstest.Start(rlqstest.Options{Conn: conn, Domain: "fleet", Report: time.Second, NoAssignment: rlqstest.Deny, OnAdmit: adm.Add})
	alive := rlqstest.Start(rlqstest.Options{Conn: conn, Domain: "fleet", Report: time.Second, NoAssignment: rlqstest.Deny,
		OnAdmit: func(b string, at time.Time) { adm.Add(b, at); survivor.Add(b, at) }})
	defer alive.Stop()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); drive(dead, id, 25, 6*time.Second); dead.Stop() }()
	go func() { defer wg.Done(); drive(alive, id, 25, 14*time.Second) }()
	wg.Wait()
	waitFor(t, "the killed Envoy's stream to be forgotten", func() bool {
		rec := httptest.NewRecorder()
		svc.DebugHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/rlqs", nil))
		var v struct {
			Streams int `json:"streams"`
		}
		return json.Unmarshal(rec.Body.Bytes(), &v) == nil && v.Streams == 1
	})
	per := adm.Snapshot()
	for sec, n := range per {
		if n > 30 {
			t.Errorf("second %d admitted %d, past 30 (all: %v)", sec-start.Unix(), n, per)
		}
	}
	t.Logf("all: %v; the survivor: %v", per, survivor.Snapshot())
}
