package rlqs

import (
	"encoding/json"
	"math"
	"net/http"
	"sort"

	"github.com/openrls/ratelimit/src/rlqs/plan"
)

// shareView is one bucket of a pool as DebugHandler shows it.
type shareView struct {
	Stream  uint64            `json:"stream"`
	Bucket  map[string]string `json:"bucket"`
	Demand  *float64          `json:"demand_per_second"`
	Target  float64           `json:"target_per_second"`
	Granted float64           `json:"granted_per_second"`
}

// poolView is one pool as DebugHandler shows it.
type poolView struct {
	Rule    string      `json:"rule"`
	Limit   uint64      `json:"limit"`
	Period  float64     `json:"period_seconds"`
	Buckets []shareView `json:"buckets"`
}

// DebugHandler serves the live pools and their shares as JSON: for each
// limit this replica grants from, every bucket's demand (requests per
// second as last reported; null until measured), its fair-share target
// and what it was last granted.
func (s *Service) DebugHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		var streams, buckets int
		var pools []poolView
		if err := s.do("the debug view", func(g *state) {
			streams, buckets = g.counts()
			pools = g.poolViews()
		}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		sort.Slice(pools, func(i, j int) bool { return pools[i].Rule < pools[j].Rule })
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"streams": streams, "buckets": buckets, "pools": pools})
	})
}

// poolViews is every pool as DebugHandler shows it, its buckets by stream.
// The views copy what they show: they are encoded off the owner.
func (g *state) poolViews() []poolView {
	var pools []poolView
	for _, p := range g.pools {
		v := poolView{Rule: p.metric, Limit: p.rule.Limit, Period: p.rule.Period.Seconds()}
		for m := range p.members {
			sh := shareView{Stream: m.b.s.id, Bucket: m.b.values, Target: m.target}
			if !math.IsInf(m.b.demand, 1) {
				d := m.b.demand
				sh.Demand = &d
			}
			if m.b.sentKind == kindLimited && m.b.sentF > 0 {
				_, _, sh.Granted = plan.TokenBucket(m.b.sentQ, m.b.sentF)
			}
			v.Buckets = append(v.Buckets, sh)
		}
		sort.Slice(v.Buckets, func(i, j int) bool { return v.Buckets[i].Stream < v.Buckets[j].Stream })
		pools = append(pools, v)
	}
	return pools
}
