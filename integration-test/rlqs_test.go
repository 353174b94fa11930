package integration

import (
	"github.com/openrls/ratelimit/src/rlqs/rlqstest"
	"sync"
	"testing"
	"time"
)

const rlqsConfig = `
domain: quota
descriptors:
  - key: tenant
    value: acme
    rate_limit: {unit: second, requests_per_unit: 30}
`

// perSecond counts admissions per wall-clock second, whoever admits them.
type perSecond struct {
	mu sync.Mutex
	n  map[int64]int
}

func (p *perSecond) add(at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == nil {
		p.n = map[int64]int{}
	}
	p.n[at.Unix()]++
}

func (p *perSecond) snapshot() map[int64]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[int64]int, len(p.n))
	for k, v := range p.n {
		out[k] = v
	}
	return out
}

// paced calls fn rate times a second until end, at most rate × the span
// plus one second's worth.
func paced(rate int, end time.Time, fn func()) {
	t := time.NewTicker(time.Second / time.Duration(rate))
	defer t.Stop()
	bound := rate * (int(time.Until(end)/time.Second) + 1)
	for n := 0; n < bound; n++ {
		if (<-t.C).After(end) {
			return
		}
		fn()
	}
}

func fakeEnvoy(p *proc, adm *perSecond) *rlqstest.Envoy {
	return rlqstest.Start(rlqstest.Options{Conn: p.conn, Domain: "quota", NoAssignment: rlqstest.Deny,
		OnAdmit: func(_ string, at time.Time) { adm.add(at) }})
}

// TestRLQSFleetThroughBinary: three fake Envoys (Envoy 1.40's client:
// reports every 5 s) with demands of 20, 20 and 5 per second on one
// tenant limited to 30 per second, through the built binary on its
// embedded store: no wall-clock second admits more than 30 across them,
// and once shares settle they use at least 60% of the limit (measured 72-74%;
// the floor leaves room for a busy machine).
func TestRLQSFleetThroughBinary(t *testing.T) {
	p := start(t, writeConfig(t, map[string]string{"quota.yaml": rlqsConfig}))
	defer p.stop(t)
	var adm perSecond
	id := map[string]string{"tenant": "acme"}
	begin := time.Now()
	end := begin.Add(25 * time.Second)
	var wg sync.WaitGroup
	for _, demand := range []int{20, 20, 5} {
		e := fakeEnvoy(p, &adm)
		defer e.Stop()
		wg.Add(1)
		go func() { defer wg.Done(); paced(demand, end, func() { e.Request(id) }) }()
	}
	wg.Wait()
	per := adm.snapshot()
	for sec, n := range per {
		if n > 30 {
			t.Errorf("second %d admitted %d, past the limit of 30: %v", sec-begin.Unix(), n, per)
		}
	}
	// Demand is first measured on the 5 s report; shares settle within a
	// TTL and a delivery bound of it. Count from 13 s.
	settled, secs := 0, 0
	for sec := begin.Unix() + 13; sec < end.Unix(); sec++ {
		settled, secs = settled+per[sec], secs+1
	}
	if settled < 18*secs {
		t.Errorf("settled seconds admitted %d in %d s, under 60%% of 30 per second: %v", settled, secs, per)
	}
	t.Logf("settled: %.0f%% of the limit", 100*float64(settled)/float64(30*secs))
}
