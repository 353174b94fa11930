package integration

import (
	"bufio"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/memcache/memcachedtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// jitterConfig: a fixed window (Redis's plain commands) and a sliding
// window (the function), both of a minute.
const jitterConfig = `
domain: jit
descriptors:
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: sliding_window}
`

// ttlSlack is how late a relative TTL may land past the instant it was
// computed for (see its use).
const ttlSlack = 250 * time.Millisecond

// jitterKeys is how many keys each case creates: enough that a spread of
// expiries shows (the chance that 100 draws below 10 s all fall under 3 s
// is 0.3^100).
const jitterKeys = 100

// TestExpirationJitterOnRedis runs the binary as production does with and
// without EXPIRATION_JITTER_MAX_SECONDS=10 and reads every key's expiry
// (PEXPIRETIME, an instant): a fixed window's key outlives its window's end
// by at most the jitter, a sliding window's its second window's end, and
// with the jitter set the expiries spread over it; without, none is past
// its end.
func TestExpirationJitterOnRedis(t *testing.T) {
	for _, jitter := range []int{0, 10} {
		t.Run(fmt.Sprintf("jitter=%ds", jitter), func(t *testing.T) {
			srv := redistest.Start(t)
			env := writeConfig(t, map[string]string{"jit.yaml": jitterConfig})
			env["REDIS_URL"] = srv.Addr
			env["EXPIRATION_JITTER_MAX_SECONDS"] = strconv.Itoa(jitter)
			p := start(t, env)
			for _, alg := range []string{"fixed", "sliding"} {
				var most time.Duration
				for i := 0; i < jitterKeys; i++ {
					sent := time.Now()
					p.should(t, "jit", configtest.Desc(fmt.Sprintf("%s=v%d", alg, i)))
					got := time.Now()
					keys := scanKeys(t, srv, "*"+counterTag(alg, i)+"*")
					if len(keys) != 1 {
						t.Fatalf("%s v%d: keys %q, want one", alg, i, keys)
					}
					at := pexpireTime(t, srv, keys[0])
					// The instant the key must live to: its window's end
					// (one window later for a sliding window), by the
					// window the hit fell in, between sent and got.
					ends := []time.Time{sent.Truncate(time.Minute).Add(time.Minute), got.Truncate(time.Minute).Add(time.Minute)}
					if alg == "sliding" {
						ends[0], ends[1] = ends[0].Add(time.Minute), ends[1].Add(time.Minute)
					}
					extra := at.Sub(ends[1])
					// Redis sets a relative TTL from its clock as the
					// command runs, a little after the instant the script
					// measured it from (and rounded up to the ms): never
					// early, a few ms late on a busy machine.
					if at.Before(ends[0]) || at.After(ends[1].Add(time.Duration(jitter)*time.Second+ttlSlack)) {
						t.Fatalf("%s v%d: %s expires at %v, want from %v to %v + %ds", alg, i, keys[0], at, ends[0], ends[1], jitter)
					}
					most = max(most, extra)
				}
				if jitter > 0 && most < 3*time.Second {
					t.Errorf("%s: the latest of %d expiries is %v past its window's end: the jitter does not spread them", alg, jitterKeys, most)
				}
			}
		})
	}
}

// TestExpirationJitterOnMemcache: memcached's keys of a fixed window expire
// a second after the window ends (memcached counts whole seconds, a second
// late rather than early), plus at most the jitter, spread over it.
func TestExpirationJitterOnMemcache(t *testing.T) {
	for _, jitter := range []int{0, 10} {
		t.Run(fmt.Sprintf("jitter=%ds", jitter), func(t *testing.T) {
			mc := memcachedtest.Start(t)
			env := writeConfig(t, map[string]string{"jit.yaml": jitterConfig})
			env["BACKEND_TYPE"] = "memcache"
			env["MEMCACHE_HOST_PORT"] = mc.Addr
			env["EXPIRATION_JITTER_MAX_SECONDS"] = strconv.Itoa(jitter)
			p := start(t, env)
			ends := map[string][2]int64{}
			for i := 0; i < jitterKeys; i++ {
				sent := time.Now()
				p.should(t, "jit", configtest.Desc(fmt.Sprintf("fixed=v%d", i)))
				got := time.Now()
				ends[counterTag("fixed", i)] = [2]int64{sent.Truncate(time.Minute).Add(time.Minute).Unix(),
					got.Truncate(time.Minute).Add(time.Minute).Unix()}
			}
			exps := memcacheExpiries(t, mc.Addr)
			var most int64
			for i := 0; i < jitterKeys; i++ {
				name := counterTag("fixed", i)
				var exp int64
				for k, e := range exps {
					if strings.Contains(k, name) {
						exp = e
					}
				}
				end := ends[name]
				// The key's expiry is measured from memcached's clock,
				// in whole seconds: at most a second either way of ours.
				if exp < end[0] || exp > end[1]+int64(jitter)+2 {
					t.Fatalf("%s expires at %d, want from %d to %d + %d s (+2 s of rounding)", name, exp, end[0], end[1], jitter)
				}
				most = max(most, exp-end[1])
			}
			if jitter > 0 && most < 4 {
				t.Errorf("the latest of %d expiries is %d s past its window's end: the jitter does not spread them", jitterKeys, most)
			}
		})
	}
}

// counterTag is how the keys of the value v<i> of descriptor key name
// end their hash tag (each part is length-prefixed).
func counterTag(name string, i int) string {
	v := "v" + strconv.Itoa(i)
	return fmt.Sprintf(":%s%d:%s}", name, len(v), v)
}

func scanKeys(t *testing.T, srv *redistest.Server, pattern string) []string {
	t.Helper()
	out, err := srv.Do("KEYS", pattern)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(out)
}

func pexpireTime(t *testing.T, srv *redistest.Server, key string) time.Time {
	t.Helper()
	out, err := srv.Do("PEXPIRETIME", key)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil || ms <= 0 {
		t.Fatalf("PEXPIRETIME %s = %q, want an instant", key, out)
	}
	return time.UnixMilli(ms)
}

// memcacheExpiries reads every key's expiry (Unix seconds) with
// lru_crawler metadump.
func memcacheExpiries(t *testing.T, addr string) map[string]int64 {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write([]byte("lru_crawler metadump all\r\n")); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		line := sc.Text()
		if line == "END" {
			return out
		}
		var key string
		var exp int64 = -1
		for _, f := range strings.Fields(line) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "key":
				key, _ = url.QueryUnescape(v)
			case "exp":
				exp, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		out[key] = exp
	}
	t.Fatalf("lru_crawler metadump: %v before END", sc.Err())
	return nil
}
