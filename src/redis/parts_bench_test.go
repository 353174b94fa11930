package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// BenchmarkDecisionParts (part of make bench) takes a fixed-window call
// apart: what each part of it costs Redis per hit, with every variant sent
// the same calls (20 decisions of 1 or 3 hits each, over 10,000 values, a
// call at a time from one client), Redis alone on CPU 1 and this process
// on CPU 0 where the machine can pin (redistest.CanPin). The variants, each
// a library loaded beside batch.lua's:
//
//   - empty: a function that returns at once (the call, its keys and its
//     argument, made into Lua values);
//   - HINCRBY only: one HINCRBY per key and nothing else (the command
//     through redis.call);
//   - batch.lua without HINCRBY: the function with the fixed window's
//     command taken out (the Lua around it);
//   - batch.lua: the function itself;
//   - plain pipeline: one HINCRBY per hit as plain commands, no function
//     (what the plain fixed-window path, plain.go, sends; a window's first
//     count adds a second call, once per key and window).
//
// Per hit: Redis CPU (INFO cpu) and the time in the function (INFO
// commandstats). docs/performance.md has the figures.
func BenchmarkDecisionParts(b *testing.B) {
	placement := "unpinned"
	srv := redistest.Start(b)
	if redistest.CanPin() {
		redistest.PinSelf(b)
		redistest.Pin(b, srv.Pid(), "1")
		placement = "pinned: this process on CPU 0, Redis on CPU 1"
	}
	c := single(b, srv)
	ctx := context.Background()
	variants := partsVariants(b)
	for _, v := range variants {
		if v.src == "" {
			continue
		}
		if err := c.FunctionLoadReplace(ctx, v.src).Err(); err != nil {
			b.Fatalf("load %s: %v", v.name, err)
		}
	}
	for range b.N {
		rows := []string{
			fmt.Sprintf("A fixed-window call taken apart: 20 decisions per call, one call at a time, %s", placement),
			"| hits per decision | variant | Redis CPU µs/hit | function µs/hit |", "|---|---|---|---|",
		}
		for _, hits := range []int{1, 3} {
			calls := partsCalls(hits)
			for round := range 2 { // the variants take turns; the second round is reported
				for _, v := range variants {
					cpu, script := partsRun(b, c, srv, v, calls)
					if round == 1 {
						rows = append(rows, fmt.Sprintf("| %d | %s | %.2f | %.2f |", hits, v.name, cpu, script))
					}
				}
			}
		}
		fmt.Fprintln(os.Stdout, strings.Join(rows, "\n"))
	}
}

// partsVariant is a library to call (src, exporting fn), or, with fn
// empty, the plain pipeline.
type partsVariant struct {
	name, fn, src string
}

func partsVariants(b *testing.B) []partsVariant {
	b.Helper()
	lib := func(name, code string) partsVariant {
		fn := "openrls_parts_" + name
		return partsVariant{fn: fn, src: "#!lua name=" + fn + "\n" + code + "redis.register_function('" + fn + "', batch)\n"}
	}
	const cmd = "    c = redis.call('HINCRBY', key, field, int_str(cost))\n    if c == cost then\n      new_window(key, w, (w + 1) * p)\n    end\n"
	if !strings.Contains(batchLib, cmd) {
		b.Fatal("batch.lua's fixed_count no longer holds the HINCRBY this benchmark takes out; update the benchmark")
	}
	empty := lib("empty", "local function batch(keys, args)\n  return ''\nend\n")
	incr := lib("incr", "local function batch(keys, args)\n  for i = 1, #keys do\n    redis.call('HINCRBY', keys[i], '1', '1')\n  end\n  return ''\nend\n")
	nocmd := lib("nocmd", strings.Replace(batchLib, cmd, "    c = cost\n", 1))
	whole := partsVariant{fn: fnName, src: libSrc}
	empty.name, incr.name, nocmd.name, whole.name = "empty function", "HINCRBY only", "batch.lua without HINCRBY", "batch.lua"
	return []partsVariant{empty, incr, nocmd, whole, {name: "plain pipeline"}}
}

// partsCall is one call's decisions: keys, the argument, and per hit the
// key and field a plain HINCRBY would take.
type partsCall struct {
	keys   []string
	arg    []byte
	fields []string
}

// partsCalls builds 200 calls of 20 decisions of hits hits each: fixed
// window, counting rejected hits (the default), far from their limits.
func partsCalls(hits int) []partsCall {
	rng := rand.New(rand.NewPCG(1, uint64(hits)))
	rule := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 1_000_000_000, Period: time.Hour, CountRejected: true}
	field := fmt.Sprint(time.Now().Unix() / 3600)
	calls := make([]partsCall, 200)
	for i := range calls {
		for range 20 {
			hs := make([]*limiter.Hit, hits)
			for j := range hs {
				hs[j] = &limiter.Hit{Key: fmt.Sprintf("{parts:d%d:v%d}", j, rng.IntN(10000)), Rule: rule, Cost: 1}
				calls[i].keys = append(calls[i].keys, keyVersion+hs[j].Key)
				calls[i].fields = append(calls[i].fields, field)
			}
			calls[i].arg = append(calls[i].arg, scriptArg(redisTime, time.Now(), modeEach, hs, nil, 0)...)
		}
	}
	return calls
}

// partsRun sends every call through v twice (the first pass creates the
// keys) and returns Redis CPU and function time per hit of the second.
func partsRun(b *testing.B, c goredis.UniversalClient, srv *redistest.Server, v partsVariant, calls []partsCall) (cpu, script float64) {
	b.Helper()
	ctx := context.Background()
	send := func(pc partsCall) {
		var err error
		if v.fn != "" {
			err = c.FCall(ctx, v.fn, pc.keys, pc.arg).Err()
		} else {
			_, err = c.Pipelined(ctx, func(p goredis.Pipeliner) error {
				for i, k := range pc.keys {
					p.HIncrBy(ctx, k, pc.fields[i], 1)
				}
				return nil
			})
		}
		if err != nil && err != goredis.Nil {
			b.Fatalf("%s: %v", v.name, err)
		}
	}
	for _, pc := range calls {
		send(pc)
	}
	stats := func() (time.Duration, time.Duration) {
		st, err := srv.CommandStats()
		if err != nil {
			b.Fatal(err)
		}
		return nodesCPU(b, []*redistest.Server{srv}), st["fcall"].Busy
	}
	cpu0, busy0 := stats()
	hits := 0
	for range 10 {
		for _, pc := range calls {
			send(pc)
			hits += len(pc.keys)
		}
	}
	cpu1, busy1 := stats()
	per := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(hits) }
	return per(cpu1 - cpu0), per(busy1 - busy0)
}
