package config

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func TestGlobsOverlap(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"/api/*", "/api/upload/*", true},
		{"/api/*", "/web/*", false},
		{"*/health", "/api/*", true},
		{"*.png", "*.jpg", false},
		{"a*b", "*c*", true}, // acb
		{"a*", "*", true},
		{"ab*", "*ba", true}, // aba
		{"a*a", "b*", false},
		{"x*y*z", "*yy*", true},
		{"a*b", "ab", true},
		{"a*b", "ac", false},
		{"**", "", true},
	} {
		if got := globsOverlap(tc.a, tc.b); got != tc.want {
			t.Errorf("globsOverlap(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
		if got := globsOverlap(tc.b, tc.a); got != tc.want {
			t.Errorf("globsOverlap(%q, %q) = %v, want %v", tc.b, tc.a, got, tc.want)
		}
	}
}

// TestGlobsOverlapAgainstEnumeration: on short random patterns, overlap
// holds exactly when some string of at most both patterns' length (a
// shortest common string never needs more) over their bytes and one other
// matches both.
func TestGlobsOverlapAgainstEnumeration(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	for range 300 {
		a, b := randString(rng, "ab*", 4), randString(rng, "ab*", 4)
		want := false
		matches := func(p, s string) bool {
			if !strings.Contains(p, "*") {
				return p == s
			}
			return globMatch(strings.Split(p, "*"), s)
		}
		var enum func(s string)
		enum = func(s string) {
			if want {
				return
			}
			if matches(a, s) && matches(b, s) {
				want = true
				return
			}
			if len(s) < len(a)+len(b) {
				for _, c := range "abc" {
					enum(s + string(c))
				}
			}
		}
		enum("")
		if got := globsOverlap(a, b); got != want {
			t.Fatalf("globsOverlap(%q, %q) = %v, enumeration says %v", a, b, got, want)
		}
	}
}

func TestOverlaps(t *testing.T) {
	f := mustParse(t, "a.yaml", `domain: d
descriptors:
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: path
    value: /api/upload/*
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: /web/static/*
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: /w*
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: org
    descriptors:
      - key: path
        value: /x/*
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: other
    descriptors:
      - key: path
        value: /x/y/*
        rate_limit: {unit: minute, requests_per_unit: 1}
`)
	// /web/static/* then /w*: the same under both precedences; /x/* and
	// /x/y/* are under different parents.
	got := Overlaps([]*File{f}, WildcardFirst)
	if len(got) != 1 {
		t.Fatalf("Overlaps = %v, want the one pair of /api/", got)
	}
	want := `a.yaml:6: descriptors[1]: wildcard "/api/upload/*" overlaps "/api/*" (a.yaml:3), which comes first: ` +
		`those values take "/api/*"'s limits, as envoyproxy/ratelimit does (WILDCARD_PRECEDENCE=first); put this one first to give them its own`
	if got[0].Error() != want {
		t.Errorf("warning =\n%s\nwant\n%s", got[0], want)
	}
	if lit := Overlaps([]*File{f}, WildcardMostLiteral); len(lit) != 1 || !strings.Contains(lit[0].Msg, "WILDCARD_PRECEDENCE=most_literal") {
		t.Errorf("under most_literal: %v", lit)
	}
}
