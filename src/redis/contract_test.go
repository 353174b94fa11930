package redis

import (
	"regexp"
	"strings"
	"testing"
)

// TestLuaContract: the Lua files take every number of the wire contract
// from the prelude luaContract writes from Go's constants. Each name the
// prelude defines is used, none is defined again in a file, and no
// algorithm, mode or flag is compared with a bare number. (That the
// values mean the same on both sides is what the store tests and the
// differential test against src/limiter show, decision by decision.)
func TestLuaContract(t *testing.T) {
	files := map[string]string{
		"common.lua": commonSrc, "fixed_window.lua": fixedWindowSrc, "sliding_window.lua": slidingWindowSrc,
		"token_bucket.lua": tokenBucketSrc, "sliding_log.lua": slidingLogSrc, "state.lua": stateSrc,
		"lease.lua": leaseSrc, "batch.lua": batchSrc,
	}
	all := strings.Join([]string{commonSrc, fixedWindowSrc, slidingWindowSrc, tokenBucketSrc, slidingLogSrc, stateSrc, leaseSrc, batchSrc}, "")
	if !strings.HasPrefix(batchLib, luaContract()) || !strings.HasSuffix(batchLib, all) {
		t.Fatal("batchLib is not the contract followed by the Lua files")
	}
	names := regexp.MustCompile(`(?m)^local ([A-Z_]+) = `).FindAllStringSubmatch(luaContract(), -1)
	if len(names) < 15 {
		t.Fatalf("the contract defines %d names: %q", len(names), luaContract())
	}
	for _, m := range names {
		name := m[1]
		if !regexp.MustCompile(`\b` + name + `\b`).MatchString(stripComments(all)) {
			t.Errorf("%s is in the contract but no Lua code uses it", name)
		}
		for file, src := range files {
			if regexp.MustCompile(`(?m)^\s*local ` + name + `\b`).MatchString(src) {
				t.Errorf("%s defines %s again", file, name)
			}
		}
	}
	bare := regexp.MustCompile(`\b(alg|mode|now)\s*(==|~=|<|>|<=|>=)\s*-?[0-9]|\bf\s*(==|<|>)\s*[1-9]`)
	for file, src := range files {
		for i, line := range strings.Split(src, "\n") {
			code := stripComments(line)
			if bare.MatchString(code) {
				t.Errorf("%s:%d compares with a bare number where the contract has a name: %s", file, i+1, strings.TrimSpace(code))
			}
		}
	}
}

// TestLuaContractValues pins the prelude's text for the constants whose
// Lua spelling is not a plain number.
func TestLuaContractValues(t *testing.T) {
	for _, want := range []string{
		"local HEADER_FORMAT = '<ddddd'\n",
		"local CAL_FORMAT = '<dddddd'\n",
		"local HIT_FORMAT = '<dddddd'\n",
		"local HIT_BYTES = 48\n",
		"local REDIS_TIME = -1\n",
		"local MAX_COUNT = 4398046511104\n",
		"local MAX_DEBT = 632448000000000\n",
	} {
		if !strings.Contains(luaContract(), want) {
			t.Errorf("the contract lacks %q:\n%s", want, luaContract())
		}
	}
}

// stripComments drops Lua's line comments.
func stripComments(src string) string {
	return regexp.MustCompile(`--[^\n]*`).ReplaceAllString(src, "")
}
