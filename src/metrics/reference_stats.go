package metrics

import (
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// maxNotFoundDomains bounds the domains counted apart in domain_not_found:
// a request names any domain it likes, and each would be a series of its
// own. Past the bound, unknown domains count under otherDomain.
const maxNotFoundDomains = 100

// otherDomain names the unknown domains past maxNotFoundDomains.
const otherDomain = "_other"

// notFound counts, per unknown domain, the descriptors asked of it.
type notFound struct {
	mu     sync.Mutex
	counts map[string]*atomic.Uint64
}

// DomainNotFound counts n descriptors of a request for a domain the config
// does not have, as envoyproxy/ratelimit counts them
// (ratelimit.service.rate_limit.DOMAIN.domain_not_found, one per
// descriptor), for up to 100 domains; later ones count as "_other".
func (r *Registry) DomainNotFound(domain string, n int) {
	r.notFound.mu.Lock()
	c := r.notFound.counts[domain]
	if c == nil {
		if r.notFound.counts == nil {
			r.notFound.counts = map[string]*atomic.Uint64{}
		}
		if len(r.notFound.counts) >= maxNotFoundDomains {
			domain = otherDomain
		}
		if c = r.notFound.counts[domain]; c == nil {
			c = &atomic.Uint64{}
			r.notFound.counts[domain] = c
		}
	}
	r.notFound.mu.Unlock()
	c.Add(uint64(n))
}

// notFoundStats are the domain_not_found counters as service stats.
func (r *Registry) notFoundStats() []serviceStat {
	r.notFound.mu.Lock()
	defer r.notFound.mu.Unlock()
	out := make([]serviceStat, 0, len(r.notFound.counts))
	for d, c := range r.notFound.counts {
		out = append(out, serviceStat{"ratelimit.service.rate_limit." + ipv4Dots(statSafe(d)) + ".domain_not_found", c.Load})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// GoRuntimeStats adds the Go runtime's memory, GC and goroutine figures
// under the names envoyproxy/ratelimit's stats library sends them
// (ratelimit.go.*: gauges, and counters of what only grows). One
// runtime.ReadMemStats serves every figure of a flush.
func (r *Registry) GoRuntimeStats() {
	snap := &memSnapshot{}
	for _, g := range []struct {
		name string
		f    func(*runtime.MemStats) uint64
	}{
		{"alloc", func(m *runtime.MemStats) uint64 { return m.Alloc }},
		{"sys", func(m *runtime.MemStats) uint64 { return m.Sys }},
		{"heapAlloc", func(m *runtime.MemStats) uint64 { return m.HeapAlloc }},
		{"heapSys", func(m *runtime.MemStats) uint64 { return m.HeapSys }},
		{"heapIdle", func(m *runtime.MemStats) uint64 { return m.HeapIdle }},
		{"heapInuse", func(m *runtime.MemStats) uint64 { return m.HeapInuse }},
		{"heapReleased", func(m *runtime.MemStats) uint64 { return m.HeapReleased }},
		{"heapObjects", func(m *runtime.MemStats) uint64 { return m.HeapObjects }},
		{"nextGC", func(m *runtime.MemStats) uint64 { return m.NextGC }},
		{"lastGC", func(m *runtime.MemStats) uint64 { return m.LastGC }},
		{"gcCPUPercent", func(m *runtime.MemStats) uint64 { return uint64(m.GCCPUFraction * 100) }},
	} {
		r.GaugeStatFunc("ratelimit.go."+g.name, func() uint64 { return g.f(snap.get()) })
	}
	r.GaugeStatFunc("ratelimit.go.numGoroutine", func() uint64 { return uint64(runtime.NumGoroutine()) })
	for _, c := range []struct {
		name string
		f    func(*runtime.MemStats) uint64
	}{
		{"totalAlloc", func(m *runtime.MemStats) uint64 { return m.TotalAlloc }},
		{"lookups", func(m *runtime.MemStats) uint64 { return m.Lookups }},
		{"mallocs", func(m *runtime.MemStats) uint64 { return m.Mallocs }},
		{"frees", func(m *runtime.MemStats) uint64 { return m.Frees }},
		{"pauseTotalNs", func(m *runtime.MemStats) uint64 { return m.PauseTotalNs }},
		{"numGC", func(m *runtime.MemStats) uint64 { return uint64(m.NumGC) }},
	} {
		r.StatFunc("ratelimit.go."+c.name, func() uint64 { return c.f(snap.get()) })
	}
}

// memSnapshot is runtime.ReadMemStats at most once a second: it stops the
// world, and a flush reads seventeen figures.
type memSnapshot struct {
	mu   sync.Mutex
	at   time.Time
	stat runtime.MemStats
}

func (s *memSnapshot) get() *runtime.MemStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.at) >= time.Second {
		runtime.ReadMemStats(&s.stat)
		s.at = time.Now()
	}
	st := s.stat
	return &st
}
