package integration

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/openrls/ratelimit/src/rlqs/rlqstest"
)

// TestRLQSQuickStart runs docs/rlqs.md's quick start the way its compose
// file does, less Docker: the built binary with the ratelimit service's
// environment from examples/compose/docker-compose-rlqs.yaml (its own
// ports and paths aside) and examples/rlqs-ratelimit-config.yaml, and
// two fake Envoys with examples/envoy-rlqs.yaml's bucket settings
// (DENY_ALL before an assignment) asking for tenant acme. It checks what
// the walkthrough says a user sees: each Envoy's first request is denied
// and the next ones admitted, the two together never pass acme's 30 a
// second, and /rlqs shows their shares of one pool.
func TestRLQSQuickStart(t *testing.T) {
	data, err := os.ReadFile("../examples/compose/docker-compose-rlqs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Services map[string]struct {
			Environment map[string]string `yaml:"environment"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile("../examples/rlqs-ratelimit-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	env := writeConfig(t, map[string]string{"rlqs-ratelimit-config.yaml": string(cfg)})
	for k, v := range c.Services["ratelimit"].Environment {
		if !strings.HasPrefix(k, "RUNTIME_") && k != "DEBUG_HOST" { // this test's paths; loopback only
			env[k] = v
		}
	}
	p := start(t, env)
	defer p.stop(t)

	var adm rlqstest.Admissions
	acme := map[string]string{"tenant": "acme"}
	envoys := []*rlqstest.Envoy{fakeEnvoy(p, &adm), fakeEnvoy(p, &adm)}
	for i, e := range envoys {
		defer e.Stop()
		if e.Request(acme) {
			t.Errorf("envoy %d: its first request was admitted before any assignment, want denied (DENY_ALL)", i)
		}
		eventually(t, "the first assignment", func() bool { s, _ := e.Strategy(acme); return s != nil })
		if !e.Request(acme) {
			t.Errorf("envoy %d: the request after its assignment was denied", i)
		}
	}
	begin := time.Now()
	end := begin.Add(12 * time.Second)
	done := make(chan struct{})
	for _, e := range envoys {
		go func() { paced(25, end, func() { e.Request(acme) }); done <- struct{}{} }()
	}
	<-done
	<-done
	for sec, n := range adm.Snapshot() {
		if n > 30 {
			t.Errorf("second %d admitted %d across both Envoys, past acme's 30", sec-begin.Unix(), n)
		}
	}

	resp, err := http.Get("http://" + p.debugAddr + "/rlqs")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var view struct {
		Streams int `json:"streams"`
		Pools   []struct {
			Rule    string `json:"rule"`
			Limit   uint64 `json:"limit"`
			Buckets []struct {
				Granted float64 `json:"granted_per_second"`
			} `json:"buckets"`
		} `json:"pools"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&view); err != nil {
		t.Fatal(err)
	}
	if view.Streams != 2 || len(view.Pools) != 1 || view.Pools[0].Limit != 30 || len(view.Pools[0].Buckets) != 2 {
		t.Fatalf("/rlqs shows %+v, want 2 streams and one pool of limit 30 with both Envoys' buckets", view)
	}
	var granted float64
	for _, b := range view.Pools[0].Buckets {
		granted += b.Granted
	}
	if granted == 0 || granted > 30 {
		t.Errorf("/rlqs: the Envoys are granted %.1f a second together, want some and at most 30", granted)
	}
	t.Logf("/rlqs: %+v", view)
}
