// Package logthrottle spaces a repeated log line: one goes out per
// interval, the others are counted, and the next one out says how many
// were held back. A store that is down, or an attacker, must not flood
// the log, and the count keeps the volume visible.
package logthrottle

import (
	"sync/atomic"
	"time"
)

// Throttle lets one line through per Every. The zero value lets every
// line through; set Every before first use, and do not copy it after.
// It is safe for concurrent use, and takes no lock.
type Throttle struct {
	Every      time.Duration
	next       atomic.Int64 // when the next line may go out (ns)
	suppressed atomic.Int64
}

// Due reports whether a line may go out at now and, when it may, how many
// were held back since the last one that did. Of lines racing for one
// turn, one goes out.
func (t *Throttle) Due(now time.Time) (suppressed int64, ok bool) {
	next := t.next.Load()
	if now.UnixNano() < next || !t.next.CompareAndSwap(next, now.Add(t.Every).UnixNano()) {
		t.suppressed.Add(1)
		return 0, false
	}
	return t.suppressed.Swap(0), true
}
