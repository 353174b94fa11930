package limiter

import (
	"fmt"
	"time"
)

// CalendarUnit is the length of a calendar window.
type CalendarUnit uint8

// The calendar units: a day from midnight, an ISO week from Monday's
// midnight, a calendar month from the 1st, a calendar year from 1 January,
// each in a Calendar's zone.
const (
	CalendarDay CalendarUnit = iota + 1
	CalendarWeek
	CalendarMonth
	CalendarYear
)

// Calendar aligns a window rule (FixedWindow, SlidingWindow) to a time
// zone's calendar instead of to multiples of its period since the Unix
// epoch: a day starts at the zone's midnight and lasts 23, 24 or 25 hours,
// a month is the calendar month. The instants come from the rule, not
// from any machine's local time, so every replica and Redis agree; the
// clock that decides which window now is in stays the store's.
type Calendar struct {
	Unit CalendarUnit
	Zone *time.Location
}

// String names the calendar as a config writes it, e.g. "month in UTC".
func (c *Calendar) String() string {
	return fmt.Sprintf("%s in %s", [...]string{"", "day", "week", "month", "year"}[c.Unit], c.Zone)
}

// epochDay is the day number (days since 1970-01-01) of a civil date.
func epochDay(y int, m time.Month, d int) int64 {
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() / 86400
}

// Window is the number of the window that holds t: consecutive windows
// have consecutive numbers. A day's number is its date's days since
// 1970-01-01 (so a calendar day in UTC is numbered as an epoch-aligned
// window of 24 hours), a week's that of its Monday divided by 7, a month's
// and a year's their count since January 1970.
func (c *Calendar) Window(t time.Time) int64 {
	y, m, d := t.In(c.Zone).Date()
	switch c.Unit {
	case CalendarWeek:
		// 1970-01-01 was a Thursday: day -3 was a Monday.
		return floorDiv(epochDay(y, m, d)+3, 7)
	case CalendarMonth:
		return int64(y-1970)*12 + int64(m-1)
	case CalendarYear:
		return int64(y - 1970)
	}
	return epochDay(y, m, d)
}

// Start is when window w starts: the first instant of its first day in
// the zone (its midnight, or where a change of clocks skips midnight, the
// first instant after it).
func (c *Calendar) Start(w int64) time.Time {
	switch c.Unit {
	case CalendarWeek:
		return midnight(1970, 1, 1+int(7*w-3), c.Zone)
	case CalendarMonth:
		return midnight(1970+int(floorDiv(w, 12)), time.Month(1+w-12*floorDiv(w, 12)), 1, c.Zone)
	case CalendarYear:
		return midnight(1970+int(w), 1, 1, c.Zone)
	}
	return midnight(1970, 1, 1+int(w), c.Zone)
}

// midnight is the first instant of the date (normalized as time.Date
// does) in zone. Where clocks skip midnight, time.Date may answer the
// instant of the skipped hour read in the new offset, which is the
// previous day's last hour (America/Havana on the day it springs
// forward); the day starts where midnight in the old offset falls.
func midnight(y int, m time.Month, d int, zone *time.Location) time.Time {
	t := time.Date(y, m, d, 0, 0, 0, 0, zone)
	civil := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	if ty, tm, td := t.Date(); ty != civil.Year() || tm != civil.Month() || td != civil.Day() {
		_, off := t.Zone()
		t = time.Unix(civil.Unix()-int64(off), 0).In(zone)
	}
	return t
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// Bounds is what a store that reads another clock (Redis's) needs to find
// a calendar window there: the number of the window before the one t is
// in, and the starts of it and the three after it, then the end of the
// last (µs). A clock within a window of t finds its window among them.
func (c *Calendar) Bounds(t time.Time) (first int64, starts [5]int64) {
	first = c.Window(t) - 1
	for i := range starts {
		starts[i] = c.Start(first + int64(i)).UnixMicro()
	}
	return first, starts
}

// windowAt is the window of r that now (µs) falls in: its number, its
// start and end, and the end of the one after it (µs).
func windowAt(now int64, r Rule) (w, start, end, next int64) {
	if r.Calendar == nil {
		p := periodUS(r)
		w = now / p
		return w, w * p, (w + 1) * p, (w + 2) * p
	}
	w = r.Calendar.Window(time.UnixMicro(now))
	return w, r.Calendar.Start(w).UnixMicro(), r.Calendar.Start(w + 1).UnixMicro(), r.Calendar.Start(w + 2).UnixMicro()
}
