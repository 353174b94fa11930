package redis

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

// TestLuaContract pins the Lua side of the wire contract to the Go
// constants it mirrors: the algorithm ids, the flag bits, the sizes of a
// decision's header and a hit's parameters, and the bounds both sides
// clamp counts and debts to. A Go constant changed without the Lua (or
// the reverse) fails here, not in a decision.
func TestLuaContract(t *testing.T) {
	for _, tc := range []struct {
		name, src, want string
	}{
		{"sliding window id", stateSrc, fmt.Sprintf("if alg == %d then\n    return sliding_window(", limiter.SlidingWindow)},
		{"token bucket id", stateSrc, fmt.Sprintf("elseif alg == %d then\n    return token_bucket(", limiter.TokenBucket)},
		{"sliding log id", stateSrc, fmt.Sprintf("elseif alg == %d then\n    return sliding_log(", limiter.SlidingLog)},
		{"fixed window's fast paths", batchSrc, fmt.Sprintf("if alg == %d and f < %d then", limiter.FixedWindow, flagRefund)},
		{"count-rejected fast path", batchSrc, fmt.Sprintf("alg == %d and (f == %d or f == %d) then", limiter.FixedWindow,
			flagCountRejected, flagCountRejected|flagAdvisory)},
		{"flags", stateSrc, fmt.Sprintf("return f %% 2 == %d, math.floor(f / %d) %% 2 == 1, math.floor(f / %d) %% 2 == 1, "+
			"math.floor(f / %d) %% 2 == 1, math.floor(f / %d)", flagAdvisory, flagRefund, flagOverdraft, flagCountRejected, flagLease)},
		{"header", batchSrc, fmt.Sprintf("now, mode, n, pos = struct.unpack('<%s', blob, pos)", strings.Repeat("d", headerBytes/8))},
		{"hit position", batchSrc, fmt.Sprintf("return pos + %d * (i - 1)", hitArgBytes)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(tc.src, tc.want) {
				t.Errorf("the Lua lacks %q", tc.want)
			}
		})
	}
	if got := luaConst(t, commonSrc, "MAX_COUNT"); got != limiter.MaxCount {
		t.Errorf("common.lua's MAX_COUNT = %d, limiter.MaxCount = %d", got, uint64(limiter.MaxCount))
	}
	if got, want := luaConst(t, tokenBucketSrc, "MAX_DEBT"), uint64(2*limiter.MaxPeriod/time.Microsecond); got != want {
		t.Errorf("token_bucket.lua's MAX_DEBT = %d, twice limiter.MaxPeriod = %d µs", got, want)
	}
}

// luaConst evaluates `local NAME = a * b * ...` in src: integers, maybe
// multiplied.
func luaConst(t *testing.T, src, name string) uint64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^local ` + name + ` = ([0-9 *]+)`).FindStringSubmatch(src)
	if m == nil {
		t.Fatalf("no local %s = ... in the Lua", name)
	}
	v := uint64(1)
	for _, f := range strings.Split(m[1], "*") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", name, m[1], err)
		}
		v *= n
	}
	return v
}
