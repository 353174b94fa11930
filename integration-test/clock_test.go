package integration

import (
	"encoding/binary"
	"math"
	"strconv"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// TestRedisScriptsReadRedisClock runs the binary as production does and
// watches Redis with MONITOR: every decision's script call carries no
// instant of the replica's own (its "now" is -1) and the script
// reads Redis's TIME, so replicas whose clocks disagree share one window.
// (A fixed window that drops rejected hits takes the script; the default
// one takes plain commands, whose window by Redis's clock
// TestRedisPlainFixedWindowAsProductionRunsIt checks.)
func TestRedisScriptsReadRedisClock(t *testing.T) {
	for _, batching := range []string{"150us", "0"} {
		t.Run("REDIS_PIPELINE_WINDOW="+batching, func(t *testing.T) {
			srv := redistest.Start(t)
			mon := srv.Monitor(t)
			p := start(t, redisEnv(t, map[string]string{"REDIS_URL": srv.Addr, "REDIS_PIPELINE_WINDOW": batching, "REJECTED_HITS": "drop"}))
			if got := p.should(t, "shared", configtest.Desc("k=clock")).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
				t.Fatalf("first hit: %v, want OK", got)
			}
			var scripts, clockReads int
			eventually(t, "the decision's script call and its TIME in MONITOR", func() bool {
				scripts, clockReads = 0, 0
				for _, line := range mon.Lines() {
					cmd, ok := redistest.ParseMonitorLine(line)
					if !ok {
						continue
					}
					switch name := strings.ToUpper(cmd.Args[0]); {
					case cmd.Source == "lua" && name == "TIME":
						clockReads++
					case name == "FCALL" || name == "EVALSHA" || name == "EVAL":
						scripts++
						if now := scriptNow(t, cmd.Args); now != -1 {
							t.Fatalf("script called with now = %v (the replica's clock), want -1 (Redis's TIME): %s", now, line)
						}
					}
				}
				return scripts > 0 && clockReads > 0
			})
			if clockReads != scripts {
				t.Errorf("%d script calls read TIME %d times, want once each", scripts, clockReads)
			}
		})
	}
}

// scriptNow returns the first decision's "now" of an FCALL, EVAL or
// EVALSHA call: the first double of the first ARGV after the keys (see
// src/redis/batch.lua); -1 asks for Redis's TIME.
func scriptNow(t *testing.T, args []string) float64 {
	t.Helper()
	if len(args) < 3 {
		t.Fatalf("short script call %q", args)
	}
	nkeys, err := strconv.Atoi(args[2])
	if err != nil || len(args) <= 3+nkeys || len(args[3+nkeys]) < 8 {
		t.Fatalf("script call %q: no decision header after %s keys", args, args[2])
	}
	// Each decision's argument opens with now as a little-endian double.
	return math.Float64frombits(binary.LittleEndian.Uint64([]byte(args[3+nkeys][:8])))
}
