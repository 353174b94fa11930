package service

import (
	"math"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
)

// buildResponse turns a plan and its outcomes into the wire answer: one status
// per request descriptor, in order. A descriptor with several limits reports
// the rejected one that frees up last, or else the one closest to its limit
// (the smallest share of its capacity left: a token bucket's burst).
// Shadow-mode descriptors answer OK; under global shadow mode (SHADOW_MODE)
// each status says what was decided and only the overall code is OK, as the
// reference answers; quota-mode descriptors (every descriptor under global quota mode) report
// OVER_LIMIT and reject the request only when all of them are past their
// budget, as the reference's quota mode does (see rejects).
func buildResponse(dc *decision, globalShadow, globalQuota bool) *rlsv3.RateLimitResponse {
	p, outs := dc.p, dc.outs
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(p.Descs)),
	}
	// One allocation for all statuses and one for all durations, instead of
	// one per descriptor each.
	sts := make([]rlsv3.RateLimitResponse_DescriptorStatus, len(p.Descs))
	durs := make([]durationpb.Duration, len(p.Descs))
	lims := make([]rlsv3.RateLimitResponse_RateLimit, len(p.Descs))
	for i, d := range p.Descs {
		st := &sts[i]
		st.Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = st
		j := dc.chosen[i]
		if j < 0 {
			if d.Unlimited {
				st.LimitRemaining = math.MaxUint32
			}
			continue
		}
		out, l := outs[j], p.Refs[j].Limit
		lim := &lims[i]
		lim.Name, lim.RequestsPerUnit, lim.Unit = l.Name, l.RequestsPerUnit, l.Unit.Proto()
		if l.UnitMultiplier > 1 {
			lim.UnitMultiplier = wrapperspb.UInt32(l.UnitMultiplier)
		}
		st.CurrentLimit = lim
		st.LimitRemaining = uint32(min(out.Remaining, math.MaxUint32))
		reset := ceilMillis(untilReset(out))
		durs[i].Seconds, durs[i].Nanos = int64(reset/time.Second), int32(reset%time.Second)
		st.DurationUntilReset = &durs[i]
		if out.Allowed {
			continue
		}
		if d.Shadow() {
			continue
		}
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if !globalShadow && rejects(p, outs, globalQuota) {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return resp
}

// untilReset is a status's duration_until_reset. For a rejected hit it is
// the time until a request like this one could be admitted (RetryAfter):
// Envoy's Retry-After and clients that back off read it so, and a token
// bucket's "until full" or a sliding window's "until every hit aged out"
// overstate that wait (a token every 10 s read as 60 s). An allowed hit
// reports when its counter is back to empty (ResetAfter), as each
// algorithm's docs say. A store that gives no wait for a rejection falls
// back to the reset: never "retry now" for a hit that was refused.
func untilReset(out limiter.Outcome) time.Duration {
	if !out.Allowed && out.RetryAfter > 0 {
		return out.RetryAfter
	}
	return out.ResetAfter
}

// rejects reports whether a request is OVER_LIMIT, global shadow mode
// aside: when a descriptor in rate limit mode is past a limit, or when
// every descriptor in quota mode (quota_mode, or all under QUOTA_MODE) is:
// quota mode admits while some quota is left. Shadow-mode descriptors never
// reject. As in envoyproxy/ratelimit, a descriptor that passes without a
// limit (nothing matched, or its limits were replaced) is a passing quota
// descriptor under QUOTA_MODE, and a shadow-mode one in quota mode passes
// as a quota descriptor; an unlimited one is neither.
func rejects(p *config.Plan, outs []limiter.Outcome, globalQuota bool) bool {
	quotas, quotasOver := 0, 0
	for _, d := range p.Descs {
		switch {
		case d.Unlimited:
			continue
		case d.Count == 0:
			if globalQuota {
				quotas++
			}
			continue
		case d.Shadow():
			if globalQuota || d.Quota() {
				quotas++
			}
			continue
		}
		over := false
		for _, o := range outs[d.First : d.First+d.Count] {
			over = over || !o.Allowed
		}
		if globalQuota || d.Quota() {
			quotas++
			if over {
				quotasOver++
			}
		} else if over {
			return true
		}
	}
	return quotas > 0 && quotasOver == quotas
}

// pick chooses which of one descriptor's limits its status reports.
func pick(hits []limiter.Hit, outs []limiter.Outcome) int {
	best := 0
	for i := 1; i < len(outs); i++ {
		a, b := outs[i], outs[best]
		switch {
		case a.Allowed != b.Allowed:
			if !a.Allowed {
				best = i
			}
		case !a.Allowed:
			if a.RetryAfter > b.RetryAfter {
				best = i
			}
		default:
			// Closest to its limit: smallest remaining/capacity, compared
			// without division (both factors fit in 32 bits). A token
			// bucket's capacity is its burst: with 5 a second and a burst
			// of 20, 19 left is nearly full, not nearly four windows' worth.
			la, lb := capacity(hits[i].Rule), capacity(hits[best].Rule)
			if a.Remaining*lb < b.Remaining*la || a.Remaining*lb == b.Remaining*la && a.Remaining < b.Remaining {
				best = i
			}
		}
	}
	return best
}

// capacity is how much of a rule's budget can be left at most.
func capacity(r limiter.Rule) uint64 {
	if r.Algorithm == limiter.TokenBucket && r.Burst > 0 {
		return r.Burst
	}
	return r.Limit
}

// ceilMillis rounds up to whole milliseconds, so that a client waiting the
// reported time never comes back a fraction too early.
func ceilMillis(d time.Duration) time.Duration {
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}
