package config

import (
	"fmt"
	"strings"
	"time"
	// The zone database, in the binary: a calendar rule's zone must mean
	// the same on every replica, whatever its image holds in
	// /usr/share/zoneinfo (a scratch or distroless image holds nothing).
	_ "time/tzdata"

	"gopkg.in/yaml.v3"

	"github.com/openrls/ratelimit/src/limiter"
)

// calendarUnits are the units a calendar aligns.
var calendarUnits = map[Unit]limiter.CalendarUnit{Day: limiter.CalendarDay, Week: limiter.CalendarWeek,
	Month: limiter.CalendarMonth, Year: limiter.CalendarYear}

// calendar decodes a limit's calendar field (UTC or an IANA zone name)
// into l, after its rate fields.
func (d *decoder) calendar(f map[string]*yaml.Node, l *Limit, path string) {
	n := f["calendar"]
	if n == nil {
		return
	}
	name := d.str(n, path, "calendar")
	zone, err := loadZone(name)
	if err != nil {
		d.errf(n, path+".calendar", "%v", err)
		return
	}
	cu, ok := calendarUnits[l.Unit]
	switch {
	case l.Unit != 0 && !ok:
		d.errf(n, path+".calendar", "calendar aligns day, week, month and year windows, not a %s", l.Unit)
	case l.UnitMultiplier > 1:
		d.errf(n, path+".calendar", "calendar windows are one %s each: unit_multiplier %d cannot be aligned to the calendar", l.Unit, l.UnitMultiplier)
	case l.Algorithm != limiter.FixedWindow && l.Algorithm != limiter.SlidingWindow:
		d.errf(n, path+".calendar", "calendar applies to the windows of fixed_window and sliding_window, and %s has none", l.Algorithm)
	case l.Lease:
		d.errf(n, path+".calendar", "calendar cannot be combined with lease: a slice is counted in an epoch-aligned window")
	case ok:
		l.Calendar = &limiter.Calendar{Unit: cu, Zone: zone}
	}
}

// loadZone is the zone a calendar names: UTC or an IANA name. "Local"
// and "" are refused: they would mean each replica's own zone.
func loadZone(name string) (*time.Location, error) {
	if name == "" || strings.EqualFold(name, "local") {
		return nil, fmt.Errorf("calendar needs a zone every replica reads alike: UTC or an IANA name such as America/New_York, not %q", name)
	}
	zone, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("unknown time zone %q (want UTC or an IANA name such as America/New_York)", name)
	}
	return zone, nil
}
