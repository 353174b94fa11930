package config

import (
	"fmt"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// Unit is the time unit of a limit.
type Unit uint8

// The units of the config format. Month is 30 days and year 365 days: windows
// have a fixed length so that every replica computes the same boundaries.
const (
	Second Unit = iota + 1
	Minute
	Hour
	Day
	Week
	Month
	Year
)

var unitInfo = [...]struct {
	name  string
	d     time.Duration
	proto rlsv3.RateLimitResponse_RateLimit_Unit
}{
	{},
	{"second", time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
	{"minute", time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{"hour", time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	{"day", 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	{"week", 7 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK},
	{"month", 30 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH},
	{"year", 365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR},
}

func (u Unit) String() string {
	if u > 0 && int(u) < len(unitInfo) {
		return unitInfo[u].name
	}
	return fmt.Sprintf("unit(%d)", u)
}

// Duration is the length of one unit.
func (u Unit) Duration() time.Duration { return unitInfo[u].d }

// Proto is the unit as the RLS response carries it.
func (u Unit) Proto() rlsv3.RateLimitResponse_RateLimit_Unit { return unitInfo[u].proto }

// parseUnit maps a config unit name (any case) to a Unit.
func parseUnit(s string) (Unit, error) {
	for i := 1; i < len(unitInfo); i++ {
		if strings.EqualFold(unitInfo[i].name, s) {
			return Unit(i), nil
		}
	}
	return 0, fmt.Errorf("unknown unit %q (want second, minute, hour, day, week, month or year)", s)
}

// unitFromOverride maps the unit of a per-request override; that enum has no
// week.
// overrideWeek is the unit number of WEEK in the response's unit enum
// (RateLimitResponse.RateLimit.Unit), which the override's enum
// (type.v3.RateLimitUnit) lacks. The reference reads an override's unit as
// the response's enum, so a client that sends 7 gets a week there; it
// does here too.
const overrideWeek typev3.RateLimitUnit = 7

func unitFromOverride(u typev3.RateLimitUnit) (Unit, bool) {
	switch u {
	case typev3.RateLimitUnit_SECOND:
		return Second, true
	case typev3.RateLimitUnit_MINUTE:
		return Minute, true
	case typev3.RateLimitUnit_HOUR:
		return Hour, true
	case typev3.RateLimitUnit_DAY:
		return Day, true
	case typev3.RateLimitUnit_MONTH:
		return Month, true
	case typev3.RateLimitUnit_YEAR:
		return Year, true
	case overrideWeek:
		return Week, true
	}
	return 0, false
}
