package config

import (
	"fmt"
	"strconv"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

// Limit is one rate limit on a descriptor. It is immutable once built.
type Limit struct {
	Name            string
	Unit            Unit
	UnitMultiplier  uint32 // >= 1
	RequestsPerUnit uint32
	Unlimited       bool
	Algorithm       limiter.Algorithm
	Burst           uint32 // token bucket capacity; 0 means RequestsPerUnit
	// Lease lets the Redis store take this limit's budget in slices (see
	// limiter.Rule.Lease); Build sets Rule.Lease from it.
	Lease bool
	// Calendar aligns the limit's windows to a zone's calendar (calendar:
	// UTC, or an IANA zone name); nil for epoch-aligned windows.
	Calendar *limiter.Calendar
	Replaces []string
	// ReplacesLines are the lines of Replaces' entries.
	ReplacesLines []int
	Line          int

	// Rule is what a store applies; identity is the part of the key that
	// names the limit (algorithm and period), so changing requests_per_unit
	// keeps the counter.
	Rule     limiter.Rule
	identity string
	// MetricKey names the limit in metrics: its descriptor's path, plus the
	// identity when the descriptor has several limits. Set by Build.
	MetricKey string
}

// finish derives Rule and identity from the written fields and checks the
// bounds that keep the algorithms exact.
func (l *Limit) finish() error {
	period := l.Unit.Duration() * time.Duration(l.UnitMultiplier)
	if l.UnitMultiplier > uint32(limiter.MaxPeriod/l.Unit.Duration()) {
		return fmt.Errorf("a window of %d %ss is longer than the longest supported (%v)", l.UnitMultiplier, l.Unit, limiter.MaxPeriod)
	}
	if l.Algorithm == limiter.SlidingLog && l.RequestsPerUnit > limiter.MaxLogLimit {
		return fmt.Errorf("sliding_log keeps every counted request, so it allows at most %d requests per window, not %d; use sliding_window for larger limits",
			limiter.MaxLogLimit, l.RequestsPerUnit)
	}
	if l.Algorithm == limiter.Concurrency && l.RequestsPerUnit > limiter.MaxLogLimit {
		return fmt.Errorf("concurrency keeps every held slot, so it allows at most %d slots, not %d", limiter.MaxLogLimit, l.RequestsPerUnit)
	}
	l.Rule = limiter.Rule{Algorithm: l.Algorithm, Limit: uint64(l.RequestsPerUnit), Period: period, Burst: uint64(l.Burst), Calendar: l.Calendar}
	if l.Algorithm == limiter.TokenBucket && l.RequestsPerUnit > 0 {
		interval := (period + time.Duration(l.RequestsPerUnit)*time.Microsecond - 1) / time.Duration(l.RequestsPerUnit)
		if period/time.Microsecond < time.Duration(l.RequestsPerUnit) {
			return fmt.Errorf("token_bucket refills at most one token per microsecond; %d per %s is too fast", l.RequestsPerUnit, periodString(l.Unit, l.UnitMultiplier))
		}
		burst := l.Burst
		if burst == 0 {
			burst = l.RequestsPerUnit
		}
		if interval.Truncate(time.Microsecond)*time.Duration(burst) > limiter.MaxPeriod {
			return fmt.Errorf("token_bucket burst %d takes longer than %v to refill", burst, limiter.MaxPeriod)
		}
	}
	l.identity = algorithmCode[l.Algorithm] + strconv.FormatInt(int64(period/time.Second), 10)
	if l.Calendar != nil {
		// A calendar's windows are not the epoch's (but in UTC days): its
		// counter is its own.
		l.identity += "@" + l.Calendar.Zone.String()
	}
	return nil
}

var algorithmCode = [...]string{"fw", "sw", "tb", "sl", "cc"}

func periodString(u Unit, mult uint32) string {
	if mult <= 1 {
		return u.String()
	}
	return fmt.Sprintf("%d %ss", mult, u)
}
