package redis

import (
	"crypto/sha1"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/openrls/ratelimit/src/limiter"
)

var (
	//go:embed common.lua
	commonSrc string
	//go:embed fixed_window.lua
	fixedWindowSrc string
	//go:embed sliding_window.lua
	slidingWindowSrc string
	//go:embed token_bucket.lua
	tokenBucketSrc string
	//go:embed sliding_log.lua
	slidingLogSrc string
	//go:embed state.lua
	stateSrc string
	//go:embed lease.lua
	leaseSrc string
	//go:embed batch.lua
	batchSrc string
)

// batchLib is all the code a call runs: the algorithm files, state.lua
// (reading and stepping a key) and lease.lua (slices) define local
// functions that batch.lua, appended last, calls; it ends by defining
// batch(keys, args). Keeping them one file each lets every algorithm sit
// beside its Go twin in src/limiter/math.go.
var batchLib = luaContract() + commonSrc + fixedWindowSrc + slidingWindowSrc + tokenBucketSrc + slidingLogSrc + stateSrc + leaseSrc + batchSrc

// batchScript is batchLib as a script (EVALSHA): what runs where the
// function cannot (see runner.go). A script's local functions are created
// anew on every call, which costs Redis more than a fixed-window hit.
var batchScript = goredis.NewScript(batchLib + "return batch(KEYS, ARGV)\n")

// libSrc is batchLib as a Redis function library (FUNCTION LOAD; Redis 7
// and later), whose code is created once, when it loads, and fnName the
// function it exports (FCALL). Both names carry the code's hash, so that
// two versions of the service (a rolling upgrade) each call their own.
var fnName, libSrc = functionLibrary(batchLib)

func functionLibrary(code string) (fn, src string) {
	sum := sha1.Sum([]byte(code))
	id := hex.EncodeToString(sum[:6])
	fn = "openrls_batch_" + id
	// The shebang names the library; register_function is how a library
	// exports a function.
	src = "#!lua name=openrls_ratelimit_" + id + "\n" + code + "redis.register_function('" + fn + "', batch)\n"
	return fn, src
}

// keyVersion names the state format written by batch.lua and plain.go.
// v3: a fixed window's count is an integer under its own key, KEY|w, that
// expires when window w ends (win_key in state.lua); v2 kept a hash of
// windows under KEY, v1 a blob. See docs/stores.md and docs/migrating.md.
const keyVersion = "rl:v3:"

// scriptMode is how batch.lua applies one decision's hits (its mode
// argument).
type scriptMode int

// The script modes; see batch.lua.
const (
	modeEach         scriptMode = iota // count each allowed hit
	modeAllOrNothing                   // count nothing if a blocking hit is rejected
	modeDryRun                         // count nothing, answer all
)

// redisTime, as a decision's now, asks batch.lua to read the clock of
// Redis (TIME) rather than take the caller's.
const redisTime = -1

// headerBytes is a decision's header: now (µs, or redisTime), mode, the
// number of hits, the TTL jitter (ms added to every TTL the decision
// sets) and the bytes of calendar blocks after its hits, as five
// little-endian doubles.
const headerBytes = 5 * 8

// calBytes is a calendar block: six little-endian doubles
// (limiter.Calendar.Bounds), after a decision's hits, one per hit of a
// calendar rule, whose burst field (a window algorithm's is 0, or a
// give-back's slice size) is minus the block's offset from the decision's
// start (see window in common.lua).
const calBytes = 6 * 8

// hitArgBytes is one hit's parameters: six little-endian doubles.
const hitArgBytes = 6 * 8

// A hit's flags double, as batch.lua's flags() reads it: a bit each, then
// the lease parameter times flagLease (contract_test.go pins both sides).
const (
	flagAdvisory      = 1
	flagRefund        = 2
	flagOverdraft     = 4
	flagCountRejected = 8
	flagLease         = 16
)

// luaContract is the Lua half of the wire contract, written from the Go
// constants it must agree with and put before every Lua file, which name
// these and have no numbers of their own for them: the algorithms, the
// modes, the flag bits, how a decision's header and hits are packed, the
// clock marker and the bounds both sides clamp counts and debts to.
func luaContract() string {
	var b strings.Builder
	b.WriteString("-- The wire contract, written from Go's constants (luaContract in scripts.go).\n")
	for _, c := range []struct {
		name  string
		value any
	}{
		{"FIXED_WINDOW", int(limiter.FixedWindow)},
		{"SLIDING_WINDOW", int(limiter.SlidingWindow)},
		{"TOKEN_BUCKET", int(limiter.TokenBucket)},
		{"SLIDING_LOG", int(limiter.SlidingLog)},
		{"CONCURRENCY", int(limiter.Concurrency)},
		{"MODE_EACH", int(modeEach)},
		{"MODE_ALL_OR_NOTHING", int(modeAllOrNothing)},
		{"MODE_DRY_RUN", int(modeDryRun)},
		{"REDIS_TIME", redisTime},
		{"FLAG_ADVISORY", flagAdvisory},
		{"FLAG_REFUND", flagRefund},
		{"FLAG_OVERDRAFT", flagOverdraft},
		{"FLAG_COUNT_REJECTED", flagCountRejected},
		{"FLAG_LEASE", flagLease},
		{"HEADER_FORMAT", "'<" + strings.Repeat("d", headerBytes/8) + "'"},
		{"HIT_FORMAT", "'<" + strings.Repeat("d", hitArgBytes/8) + "'"},
		{"HIT_BYTES", hitArgBytes},
		{"CAL_FORMAT", "'<" + strings.Repeat("d", calBytes/8) + "'"},
		{"MAX_COUNT", uint64(limiter.MaxCount)},
		// limiter's maxDebt: twice the longest period, in µs.
		{"MAX_DEBT", int64(2 * limiter.MaxPeriod / time.Microsecond)},
	} {
		fmt.Fprintf(&b, "local %s = %v\n", c.name, c.value)
	}
	return b.String()
}

// scriptArg builds one decision's argument (see batch.lua): the header,
// then each hit's parameters. One string per decision, rather than one per
// field, spares Redis a string to parse and Lua a string to make for each;
// a merged batch concatenates its decisions' into one (merged) for the
// same reason. leases, when not nil, holds each hit's
// lease parameter (see batch.lua and lease.go); jitterMS lengthens every
// TTL the decision sets (Options.ExpirationJitter). A calendar rule's
// windows are sent as a block of the windows around at (the local clock,
// or now when set), among which Redis's clock finds its own.
func scriptArg(now int64, at time.Time, mode scriptMode, hits []*limiter.Hit, leases []uint64, jitterMS int64) []byte {
	if mode == modeAllOrNothing && len(hits) == 1 {
		// One hit is all or nothing by itself: mode 0 decides it the same
		// (a rejected hit counts nothing, an overdraft or count-rejected
		// hit counts) along
		// the common path, which builds no tables (see batch.lua).
		mode = modeEach
	}
	cals := 0
	for _, h := range hits {
		if h.Rule.Calendar != nil {
			cals++
		}
	}
	end := headerBytes + hitArgBytes*len(hits)
	buf := make([]byte, end+calBytes*cals)
	putDoubles(buf, float64(now), float64(mode), float64(len(hits)), float64(jitterMS), float64(calBytes*cals))
	for i, h := range hits {
		burst := float64(h.Rule.Burst)
		if h.Rule.Calendar != nil {
			burst = -float64(end)
			first, starts := h.Rule.Calendar.Bounds(at)
			putDoubles(buf[end:], float64(first), float64(starts[0]), float64(starts[1]), float64(starts[2]), float64(starts[3]), float64(starts[4]))
			end += calBytes
		}
		flags := 0.0 // see batch.lua's flags
		if h.Advisory {
			flags += flagAdvisory
		}
		if h.Refund {
			flags += flagRefund
		}
		if h.Rule.Overdraft {
			flags += flagOverdraft
		}
		if h.Rule.CountRejected {
			flags += flagCountRejected
		}
		if leases != nil {
			flags += flagLease * float64(min(leases[i], 1<<44))
		}
		putDoubles(buf[headerBytes+i*hitArgBytes:],
			float64(h.Rule.Algorithm),
			float64(h.Rule.Limit),
			float64(h.Rule.Period/time.Microsecond),
			burst,
			float64(min(h.Cost, 1<<53)), // any cost above a limit is rejected alike
			flags)
	}
	return buf
}

// putDoubles writes vs into b as little-endian doubles.
func putDoubles(b []byte, vs ...float64) {
	for j, v := range vs {
		binary.LittleEndian.PutUint64(b[8*j:], math.Float64bits(v))
	}
}

// grant is a slice batch.lua counted beside an allowed hit: extra hits,
// counted in window number window.
type grant struct {
	extra  uint64
	window int64
	// gen is the generation of the key's record of slices (see batch.lua's
	// held hits), which a give-back names.
	gen int64
}

// answerBytes is how many bytes of b answer its first hits hits (see
// parseOutcomes), and whether b holds them all.
func answerBytes(b string, hits int) (int, bool) {
	r := reply{b: b}
	for range hits {
		if _, ok := r.next(); !ok {
			return 0, false
		}
	}
	return r.at, true
}

// parseOutcomes reads batch.lua's reply to n hits. A hit granted a slice
// gets it in grants, when not nil.
func parseOutcomes(v any, n int, grants []grant) ([]limiter.Outcome, error) {
	b, ok := v.(string)
	bad := func() error {
		return fmt.Errorf("redis: unexpected script reply %T (%d bytes) for %d hits", v, len(b), n)
	}
	if !ok || len(b) < 4*8*n {
		return nil, bad()
	}
	r := reply{b: b}
	outs := make([]limiter.Outcome, n)
	for i := range outs {
		a, ok := r.next()
		if !ok {
			return nil, bad()
		}
		outs[i] = limiter.Outcome{
			Allowed:    a.allowed >= 1,
			Remaining:  uint64(max(a.remaining, 0)),
			ResetAfter: micros(a.reset),
			RetryAfter: micros(a.retry),
		}
		if a.remaining < 0 && a.allowed < 1 {
			// A rejected hit that was counted: its count's excess over
			// the limit (see fixed_window.lua).
			outs[i].Excess = uint64(-a.remaining)
		}
		if a.allowed > 1 {
			// A slice: the retry double names its window, not a wait.
			outs[i].RetryAfter = 0
			if grants != nil {
				grants[i] = grant{extra: uint64(a.allowed - 1), window: a.retry, gen: a.gen}
			}
		}
	}
	if r.at != len(b) {
		return nil, bad()
	}
	return outs, nil
}

// micros is us microseconds as a duration: none below zero, and at most
// the longest duration there is, where a count of microseconds past
// 2^63/1000 would wrap into a negative one.
func micros(us int64) time.Duration {
	const most = math.MaxInt64 / int64(time.Microsecond)
	return time.Duration(min(max(us, 0), most)) * time.Microsecond
}

// reply reads batch.lua's reply one hit's answer at a time: 4
// little-endian doubles (allowed, remaining, reset, retry), and a fifth,
// the slice's generation, after a hit granted a slice (allowed > 1).
// Every reader of a reply goes through next, so that splitting a merged
// reply (answerBytes) and decoding it (parseOutcomes) cannot disagree on
// where an answer ends.
type reply struct {
	b  string
	at int // the byte where the next answer starts
}

// answer is one hit's part of a reply.
type answer struct{ allowed, remaining, reset, retry, gen int64 }

// next reads the next answer; false if the reply ends inside it or it
// holds a double batch.lua never sends.
func (r *reply) next() (answer, bool) {
	var a answer
	if r.at+32 > len(r.b) {
		return a, false
	}
	var ok [4]bool
	a.allowed, ok[0] = r.double(0)
	a.remaining, ok[1] = r.double(1)
	a.reset, ok[2] = r.double(2)
	a.retry, ok[3] = r.double(3)
	if ok != [4]bool{true, true, true, true} {
		return a, false
	}
	size := 32
	if a.allowed > 1 {
		if size = 40; r.at+size > len(r.b) {
			return a, false
		}
		if a.gen, ok[0] = r.double(4); !ok[0] {
			return a, false
		}
	}
	r.at += size
	return a, true
}

// double is the answer's double i as an int64, false for a double
// batch.lua never sends (NaN, infinite, past ±2^62): converted, it would
// be whatever the machine makes of it.
func (r *reply) double(i int) (int64, bool) {
	at := r.at + 8*i
	var u uint64
	for k := 7; k >= 0; k-- {
		u = u<<8 | uint64(r.b[at+k])
	}
	v := math.Float64frombits(u)
	if !exact(v) {
		return 0, false
	}
	return int64(v), true
}

// exact reports whether v is a number batch.lua's replies hold: finite,
// and within ±2^62, where a double converts to int64 as it reads.
func exact(v float64) bool { return v >= -(1<<62) && v <= 1<<62 }
