package limiter

import (
	"strconv"
	"time"
)

// The windows of a rule, in one place: which window an instant falls in,
// when a window starts and ends, and the name of a counter that holds one
// window alone. Every room counts fixed windows by these: the stores, RLS's
// shared counters and RLQS's reservations. Windows are numbered in
// microseconds of the Unix epoch, the unit the stores count in; a rule
// without a calendar has window w start at w periods since the epoch, a
// calendar's windows are consecutive from its own origin (Calendar.Window).

// FixedWindowAt is the number of the fixed window of r that now falls in,
// and the instant it ends: a store that counts a fixed window in an
// integer keeps one per window.
func FixedWindowAt(now time.Time, r Rule) (w int64, end time.Time) {
	w, _, e, _ := windowAt(now.UnixMicro(), r)
	return w, time.UnixMicro(e)
}

// WindowStart is the instant window w of r starts.
func WindowStart(w int64, r Rule) time.Time {
	if r.Calendar != nil {
		return r.Calendar.Start(w)
	}
	return time.UnixMicro(w * periodUS(r))
}

// WindowKey is the key of the counter that holds key's window w alone.
// Counting a fixed window under such keys lets a window be counted ahead
// of time (RLQS reserves grants window by window) without ending the
// window in force, which a key holding one window at a time would; RLS
// hits counted on the same names (RLQS_SHARED_COUNTERS) share those
// counts.
//
// The stores name their own per-window state under such a key as they
// always have (Redis "key|w", in plain.go and state.lua alike; memcache
// "key:w"): renamed, every count in force would start again from zero
// on the first replica upgraded, for a day's limit a day's count.
func WindowKey(key string, w int64) string {
	return key + "\x00rlqs\x00" + strconv.FormatInt(w, 10)
}
