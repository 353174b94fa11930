package service

import (
	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
)

// decision is a planned request's outcomes and, worked out once, the hit
// each descriptor's status reports. The response, the rate limit headers,
// the dynamic metadata all read it, so they cannot disagree on which of a
// descriptor's limits it is under.
type decision struct {
	p    *config.Plan
	outs []limiter.Outcome
	// chosen holds, by descriptor, the hit (an index into p.Hits and outs)
	// its status reports, or -1 when it has no limit.
	chosen []int
}

// decide chooses each descriptor's reported hit (pick) into buf's room,
// so that a request of a few descriptors allocates nothing for it.
func decide(p *config.Plan, outs []limiter.Outcome, buf []int) decision {
	chosen := buf[:0]
	for _, d := range p.Descs {
		j := -1
		if d.Count > 0 {
			j = pick(p.Hits[d.First:d.First+d.Count], outs[d.First:d.First+d.Count]) + d.First
		}
		chosen = append(chosen, j)
	}
	return decision{p: p, outs: outs, chosen: chosen}
}
