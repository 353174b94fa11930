package config

import (
	"github.com/openrls/ratelimit/src/config/configtest"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// linearFind is the matcher before the index: every wildcard of the key in
// precedence order (config order, or most literal characters first), the
// first that matches wins. The index must agree with it everywhere.
func linearFind(w *wildIndex, value string, prec WildcardPrecedence) *Node {
	ns := slices.Clone(w.all)
	if prec == WildcardMostLiteral {
		slices.SortStableFunc(ns, func(a, b *Node) int { return b.literal - a.literal })
	}
	for _, n := range ns {
		if globMatch(n.wildcard, value) {
			return n
		}
	}
	return nil
}

func randString(rng *rand.Rand, alphabet string, max int) string {
	b := make([]byte, rng.IntN(max+1))
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return string(b)
}

// TestWildIndexMatchesLinearScan is the differential test: random patterns
// with '*' anywhere (prefix, suffix, middle, several, alone) and random
// values over a small alphabet, so that many of them match.
func TestWildIndexMatchesLinearScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for round := range 600 {
		prec := WildcardPrecedence(round % 2)
		w := &wildIndex{}
		seen := map[string]bool{}
		for range 1 + rng.IntN(40) {
			p := randString(rng, "ab*", 6)
			if !strings.Contains(p, "*") || seen[p] {
				continue
			}
			seen[p] = true
			w.add(&Node{key: "k", value: p, wildcard: strings.Split(p, "*")})
		}
		w.seal(prec)
		for range 200 {
			v := randString(rng, "ab", 8)
			got, want := w.match(v), linearFind(w, v, prec)
			if got != want {
				name := func(n *Node) string {
					if n == nil {
						return "nothing"
					}
					return n.value
				}
				t.Fatalf("round %d (precedence %d): patterns %q, value %q: index matches %s, linear scan %s", round, prec, slices.Sorted(func(yield func(string) bool) {
					for p := range seen {
						if !yield(p) {
							return
						}
					}
				}), v, name(got), name(want))
			}
		}
	}
}

// TestWildcardPrecedenceAtEveryLevel: Build puts wildcards in precedence
// order on nested levels too (a level left unsealed matched in config
// order), here with two patterns of one prefix written less specific first:
// the first in the config wins by default, as in envoyproxy/ratelimit; the
// more literal one under WildcardMostLiteral.
func TestWildcardPrecedenceAtEveryLevel(t *testing.T) {
	f := mustParse(t, "test.yaml", `domain: w
descriptors:
  - key: x
    value: "a*"
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: x
    value: "a*c"
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: org
    descriptors:
      - key: x
        value: "a*"
        rate_limit: {unit: second, requests_per_unit: 4}
      - key: x
        value: "a*c"
        rate_limit: {unit: second, requests_per_unit: 5}
`)
	for _, tc := range []struct {
		prec    WildcardPrecedence
		entries []string
		want    uint32
	}{
		{WildcardFirst, []string{"x=abc"}, 2},
		{WildcardFirst, []string{"x=abd"}, 2},
		{WildcardFirst, []string{"org=o", "x=abc"}, 4},
		{WildcardFirst, []string{"org=o", "x=abd"}, 4},
		{WildcardMostLiteral, []string{"x=abc"}, 3},
		{WildcardMostLiteral, []string{"x=abd"}, 2},
		{WildcardMostLiteral, []string{"org=o", "x=abc"}, 5},
		{WildcardMostLiteral, []string{"org=o", "x=abd"}, 4},
	} {
		c, err := Build([]*File{f}, Options{Wildcards: tc.prec})
		if err != nil {
			t.Fatal(err)
		}
		n := c.Domain("w").Match(configtest.Desc(tc.entries...).GetEntries())
		if n == nil || n.limits[0].RequestsPerUnit != tc.want {
			t.Errorf("precedence %d: Match(%v) = %v, want the rule of %d", tc.prec, tc.entries, n, tc.want)
		}
	}
}
