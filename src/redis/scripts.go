package redis

import (
	"crypto/sha1"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
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
var batchLib = commonSrc + fixedWindowSrc + slidingWindowSrc + tokenBucketSrc + slidingLogSrc + stateSrc + leaseSrc + batchSrc

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

// headerBytes is a decision's header: now (µs, or redisTime), mode and the
// number of hits, as three little-endian doubles.
const headerBytes = 3 * 8

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

// scriptArg builds one decision's argument (see batch.lua): the header,
// then each hit's parameters. One string per decision, rather than one per
// field, spares Redis a string to parse and Lua a string to make for each;
// a merged batch concatenates its decisions' into one (merged) for the
// same reason. leases, when not nil, holds each hit's
// lease parameter (see batch.lua and lease.go).
func scriptArg(now int64, mode scriptMode, hits []*limiter.Hit, leases []uint64) []byte {
	if mode == modeAllOrNothing && len(hits) == 1 {
		// One hit is all or nothing by itself: mode 0 decides it the same
		// (a rejected hit counts nothing, an overdraft or count-rejected
		// hit counts) along
		// the common path, which builds no tables (see batch.lua).
		mode = modeEach
	}
	buf := make([]byte, headerBytes+hitArgBytes*len(hits))
	putDoubles(buf, float64(now), float64(mode), float64(len(hits)))
	for i, h := range hits {
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
			float64(h.Rule.Burst),
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
	at := 0
	for range hits {
		if at+32 > len(b) {
			return 0, false
		}
		// The first double is 0 (rejected), 1 (allowed) or 1 + a slice,
		// which a fifth double follows.
		allowed := math.Float64frombits(uint64(b[at]) | uint64(b[at+1])<<8 | uint64(b[at+2])<<16 | uint64(b[at+3])<<24 |
			uint64(b[at+4])<<32 | uint64(b[at+5])<<40 | uint64(b[at+6])<<48 | uint64(b[at+7])<<56)
		if !exact(allowed) {
			return 0, false // not batch.lua's: parseOutcomes refuses it too
		}
		at += 32
		if int64(allowed) > 1 { // as parseOutcomes reads it
			at += 8
		}
	}
	if at > len(b) {
		return 0, false
	}
	return at, true
}

// parseOutcomes reads batch.lua's reply: 4 little-endian doubles per hit,
// and a fifth after a hit granted a slice. A hit granted a slice gets it
// in grants, when not nil.
func parseOutcomes(reply any, n int, grants []grant) ([]limiter.Outcome, error) {
	b, ok := reply.(string)
	bad := func() error {
		return fmt.Errorf("redis: unexpected script reply %T (%d bytes) for %d hits", reply, len(b), n)
	}
	if !ok || len(b) < 4*8*n || len(b)%8 != 0 {
		return nil, bad()
	}
	r := doubles{b: b, valid: true}
	f := r.at
	outs := make([]limiter.Outcome, n)
	at := 0 // the double where hit i's answer starts
	for i := range outs {
		if 8*(at+4) > len(b) {
			return nil, bad()
		}
		allowed, retry, rem := f(at), f(at+3), f(at+1)
		outs[i] = limiter.Outcome{
			Allowed:    allowed >= 1,
			Remaining:  uint64(max(rem, 0)),
			ResetAfter: time.Duration(max(f(at+2), 0)) * time.Microsecond,
		}
		if rem < 0 && allowed < 1 {
			// A rejected hit that was counted: its count's excess over
			// the limit (see fixed_window.lua).
			outs[i].Excess = uint64(-rem)
		}
		at += 4
		if allowed > 1 {
			// A slice: the retry double names its window, a fifth its
			// generation.
			if 8*(at+1) > len(b) {
				return nil, bad()
			}
			if grants != nil {
				grants[i] = grant{extra: uint64(allowed - 1), window: retry, gen: f(at)}
			}
			retry = 0
			at++
		}
		outs[i].RetryAfter = time.Duration(max(retry, 0)) * time.Microsecond
	}
	if 8*at != len(b) || !r.valid {
		return nil, bad()
	}
	return outs, nil
}

// doubles reads batch.lua's reply, little-endian doubles; a double it
// never sends (NaN, infinite, past ±2^62) clears valid and reads as 0:
// converted, it would be whatever the machine makes of it.
type doubles struct {
	b     string
	valid bool
}

// at is double i as an int64.
func (d *doubles) at(i int) int64 {
	var u uint64
	for k := 7; k >= 0; k-- {
		u = u<<8 | uint64(d.b[8*i+k])
	}
	v := math.Float64frombits(u)
	if !exact(v) {
		d.valid = false
		return 0
	}
	return int64(v)
}

// exact reports whether v is a number batch.lua's replies hold: finite,
// and within ±2^62, where a double converts to int64 as it reads.
func exact(v float64) bool { return v >= -(1<<62) && v <= 1<<62 }
