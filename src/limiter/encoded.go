package limiter

import (
	"encoding/binary"
	"time"
)

// This file lets a store that keeps counters in a key-value store of its
// own (memcache) apply the arithmetic of math.go: a counter's state as
// bytes, replaced by compare-and-swap, or, for a fixed window, a plain
// integer per window that the store increments atomically.

// encodedVersion starts every encoded state: bytes of another format are
// read as no state.
const encodedVersion = 1

// Eval applies cost hits (or a refund) at now under r to state, an
// encoded state as Eval returned it (nil, or bytes of another format or
// algorithm, is no state). It returns the new state, the outcome, the
// instant after which the new state is as good as no state (its expiry),
// and whether to write it.
func Eval(state []byte, now time.Time, r Rule, cost uint64, refund bool) (next []byte, out Outcome, expires time.Time, write bool) {
	st, out, exp, write := step(decodeState(state, r.Algorithm), now.UnixMicro(), r, cost, refund)
	return encodeState(st, r.Algorithm), out, time.UnixMicro(exp), write
}

// EvalFixed decides a FixedWindow hit of cost at now, given the window's
// count before it (a refund gives cost back). It returns the count the
// window should hold after it (before itself when nothing is written) and
// the outcome, and whether the step writes (as Eval's write). A store
// that increments first and decides after (memcache's incr) passes the
// count before its own increment and takes back the difference: every
// decision is then the one the atomic step would make in the increments'
// order.
func EvalFixed(before uint64, now time.Time, r Rule, cost uint64, refund bool) (after uint64, out Outcome, write bool) {
	w, _ := FixedWindowAt(now, r)
	st, out, _, write := fixedStep(state{w: w, x: before}, now.UnixMicro(), r, cost, refund)
	if !write {
		return before, out, false
	}
	return st.x, out, true
}

// MaxCount is the largest count a fixed window holds (overdraft and
// CountRejected let a count pass its limit up to it): a store that
// increments first adds at most this much.
const MaxCount = maxCount

// encodeState writes st for algorithm a: the version, the algorithm, then
// w, x and y as 8 bytes each (little-endian), or a log's entries
// as (t, n) pairs.
func encodeState(st state, a Algorithm) []byte {
	if a.keepsLog() {
		var log []logEntry
		if st.log != nil {
			log = *st.log
		}
		b := make([]byte, 2, 2+16*len(log))
		b[0], b[1] = encodedVersion, byte(a)
		for _, e := range log {
			b = binary.LittleEndian.AppendUint64(b, uint64(e.t))
			b = binary.LittleEndian.AppendUint64(b, e.n)
		}
		return b
	}
	b := make([]byte, 2, 26)
	b[0], b[1] = encodedVersion, byte(a)
	b = binary.LittleEndian.AppendUint64(b, uint64(st.w))
	b = binary.LittleEndian.AppendUint64(b, st.x)
	return binary.LittleEndian.AppendUint64(b, st.y)
}

// decodeState reads what encodeState wrote for a; anything else is no
// state.
func decodeState(b []byte, a Algorithm) state {
	if len(b) < 2 || b[0] != encodedVersion || b[1] != byte(a) {
		return state{}
	}
	b = b[2:]
	if a.keepsLog() {
		if len(b)%16 != 0 {
			return state{}
		}
		log := make([]logEntry, 0, len(b)/16)
		for ; len(b) > 0; b = b[16:] {
			log = append(log, logEntry{t: int64(binary.LittleEndian.Uint64(b)), n: binary.LittleEndian.Uint64(b[8:])})
		}
		return state{log: &log}
	}
	if len(b) != 24 {
		return state{}
	}
	return state{w: int64(binary.LittleEndian.Uint64(b)), x: binary.LittleEndian.Uint64(b[8:]), y: binary.LittleEndian.Uint64(b[16:])}
}
