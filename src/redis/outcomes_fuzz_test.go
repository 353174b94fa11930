package redis

import (
	"encoding/binary"
	"math"
	"testing"
)

// packDoubles packs little-endian doubles, as batch.lua packs its reply.
func packDoubles(fs ...float64) string {
	b := make([]byte, 8*len(fs))
	for i, f := range fs {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(f))
	}
	return string(b)
}

// FuzzParseOutcomes feeds parseOutcomes and answerBytes, which read
// Redis's reply bytes, any bytes and hit count: neither panics; a reply
// parseOutcomes accepts is whole by answerBytes, answers every hit, and
// reports no negative duration; a slice's grant names its extra hits.
func FuzzParseOutcomes(f *testing.F) {
	f.Add(packDoubles(1, 9, 1e6, 0), 1)
	f.Add(packDoubles(0, -3, 5e5, 5e5), 1)                  // a counted rejection's excess
	f.Add(packDoubles(6, 4, 1e6, 17, 2, 0, 0, 1e6, 1e6), 2) // a slice, then a rejection
	f.Add(packDoubles(math.NaN(), math.Inf(1), -1, math.Inf(-1)), 1)
	f.Add("", 0)
	f.Add(packDoubles(0, 0, 1e16, 1e16), 1) // microseconds past a duration's range
	f.Fuzz(func(t *testing.T, reply string, n int) {
		if n < 0 || n > 1<<12 {
			return
		}
		grants := make([]grant, n)
		outs, err := parseOutcomes(reply, n, grants)
		at, whole := answerBytes(reply, n)
		if err != nil {
			return
		}
		if len(outs) != n {
			t.Fatalf("%d outcomes for %d hits", len(outs), n)
		}
		if !whole || at != len(reply) {
			t.Fatalf("parseOutcomes took %d bytes; answerBytes says %d (whole %v)", len(reply), at, whole)
		}
		for i, o := range outs {
			if o.ResetAfter < 0 || o.RetryAfter < 0 {
				t.Fatalf("hit %d: negative durations %+v", i, o)
			}
			if o.Allowed && o.Excess != 0 {
				t.Fatalf("hit %d: allowed with an excess %+v", i, o)
			}
		}
	})
}
