package limiter

import (
	"testing"
	"time"
)

func zone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// TestCalendarWindows: each window starts at its zone's midnight, on a
// Monday, the 1st or 1 January, and lasts what the calendar says: 23 or
// 25 hours across a change of clocks, 28 to 31 days for a month.
func TestCalendarWindows(t *testing.T) {
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		name, zone string
		unit       CalendarUnit
		at         string
		start, end string // UTC
	}{
		{"a UTC day", "UTC", CalendarDay, "2026-12-02T07:00:00Z", "2026-12-02T00:00:00Z", "2026-12-03T00:00:00Z"},
		{"a day 14 hours ahead", "Pacific/Kiritimati", CalendarDay, "2026-12-02T07:00:00Z", "2026-12-01T10:00:00Z", "2026-12-02T10:00:00Z"},
		{"a day 14 hours ahead, after its midnight", "Pacific/Kiritimati", CalendarDay, "2026-12-02T10:00:00Z", "2026-12-02T10:00:00Z", "2026-12-03T10:00:00Z"},
		{"springing forward: 23 hours", "America/New_York", CalendarDay, "2026-03-08T12:00:00Z", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"},
		{"falling back: 25 hours", "America/New_York", CalendarDay, "2026-11-01T12:00:00Z", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"},
		{"midnight skipped: the day starts at 01:00", "America/Havana", CalendarDay, "2026-03-08T12:00:00Z", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"},
		{"the day before a skipped midnight", "America/Havana", CalendarDay, "2026-03-08T04:30:00Z", "2026-03-07T05:00:00Z", "2026-03-08T05:00:00Z"},
		{"an ISO week from Monday", "Europe/Lisbon", CalendarWeek, "2026-12-02T07:00:00Z", "2026-11-30T00:00:00Z", "2026-12-07T00:00:00Z"},
		{"a week across New Year", "UTC", CalendarWeek, "2027-01-01T00:00:00Z", "2026-12-28T00:00:00Z", "2027-01-04T00:00:00Z"},
		{"a month of 31 days", "America/New_York", CalendarMonth, "2026-12-02T07:00:00Z", "2026-12-01T05:00:00Z", "2027-01-01T05:00:00Z"},
		{"a leap February", "UTC", CalendarMonth, "2028-02-15T00:00:00Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z"},
		{"a month across a change of clocks", "Europe/Berlin", CalendarMonth, "2026-03-15T00:00:00Z", "2026-02-28T23:00:00Z", "2026-03-31T22:00:00Z"},
		{"a leap year", "Asia/Tokyo", CalendarYear, "2028-06-01T00:00:00Z", "2027-12-31T15:00:00Z", "2028-12-31T15:00:00Z"},
		{"before the epoch", "UTC", CalendarMonth, "1969-12-31T23:59:59Z", "1969-12-01T00:00:00Z", "1970-01-01T00:00:00Z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Calendar{Unit: tc.unit, Zone: zone(t, tc.zone)}
			at := utc(tc.at)
			w := c.Window(at)
			if got := c.Start(w); !got.Equal(utc(tc.start)) {
				t.Errorf("start %v, want %s", got.UTC(), tc.start)
			}
			if got := c.Start(w + 1); !got.Equal(utc(tc.end)) {
				t.Errorf("end %v, want %s", got.UTC(), tc.end)
			}
			// The window's bounds are its own: the instant before the start
			// is in the window before, the start and the end's last instant
			// in this one.
			start, end := utc(tc.start), utc(tc.end)
			if c.Window(start) != w || c.Window(end.Add(-time.Microsecond)) != w || c.Window(start.Add(-time.Microsecond)) != w-1 || c.Window(end) != w+1 {
				t.Errorf("windows around %s..%s: %d %d %d %d, want %d inside, one less before, one more at the end", tc.start, tc.end,
					c.Window(start.Add(-time.Microsecond)), c.Window(start), c.Window(end.Add(-time.Microsecond)), c.Window(end), w)
			}
		})
	}
	// A UTC day is numbered as the epoch-aligned day: switching a daily
	// rule to calendar: UTC keeps its windows.
	c := &Calendar{Unit: CalendarDay, Zone: time.UTC}
	for _, s := range []string{"1970-01-01T00:00:00Z", "2026-12-02T23:59:59Z", "1969-12-31T12:00:00Z"} {
		at := utc(s)
		if got, want := c.Window(at), at.Unix()/86400-map[bool]int64{true: 1}[at.Unix() < 0]; got != want {
			t.Errorf("UTC day of %s: %d, want %d", s, got, want)
		}
	}
}

// TestCalendarFixedWindow: a calendar rule counts in its window and
// answers duration_until_reset to the window's true end.
func TestCalendarFixedWindow(t *testing.T) {
	r := Rule{Algorithm: FixedWindow, Limit: 2, Period: 24 * time.Hour, Calendar: &Calendar{Unit: CalendarDay, Zone: zone(t, "Pacific/Kiritimati")}}
	at := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC) // 21:00 there
	var st state
	for i, want := range []bool{true, true, false} {
		next, out, exp, write := fixedStep(st, at.UnixMicro(), r, 1, false)
		if out.Allowed != want || out.ResetAfter != 3*time.Hour || exp != at.Add(3*time.Hour).UnixMicro() {
			t.Fatalf("hit %d: %+v, expires %v; want allowed %v, reset in 3h (midnight there)", i, out, time.UnixMicro(exp).UTC(), want)
		}
		if write {
			st = next
		}
	}
	// After that midnight: a new day.
	if _, out, _, _ := fixedStep(st, at.Add(3*time.Hour).UnixMicro(), r, 1, false); !out.Allowed || out.ResetAfter != 24*time.Hour {
		t.Errorf("after midnight there: %+v, want allowed, reset in 24h", out)
	}
}
