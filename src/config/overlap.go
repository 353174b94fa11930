package config

import (
	"fmt"
	"strings"
)

// maxOverlapChecks bounds the pattern pairs Overlaps compares, so that a
// config with tens of thousands of wildcards under one key is checked in
// well under a second; past it, Overlaps says it stopped.
const maxOverlapChecks = 5_000_000

// maxOverlapStates bounds globsOverlap's walk; longer pattern pairs whose
// literal ends agree are taken to overlap.
const maxOverlapStates = 1 << 16

// Overlaps returns a warning for each pair of wildcard values of one key,
// at one level of one domain, that some request value matches both and
// that the two precedences decide differently: the later one in the config
// has more literal characters. Under WildcardFirst (envoyproxy/ratelimit's
// order) the earlier one applies to such values; under WildcardMostLiteral
// the later one. The warning names the later one's file and line and the
// earlier one's. Pairs both precedences decide alike are not reported.
func Overlaps(files []*File, prec WildcardPrecedence) []*Error {
	type wild struct {
		file string
		d    *Descriptor
	}
	groups := map[string][]wild{} // domain, parent rule and key → wildcards in config order
	var order []string
	var walk func(file, parent string, ds []*Descriptor)
	walk = func(file, parent string, ds []*Descriptor) {
		for _, d := range ds {
			if strings.Contains(d.Value, "*") {
				g := parent + "\x00" + d.Key
				if groups[g] == nil {
					order = append(order, g)
				}
				groups[g] = append(groups[g], wild{file, d})
			}
			walk(file, parent+"\x00"+d.Key+"\x01"+d.Value, d.Descriptors)
		}
	}
	for _, f := range files {
		walk(f.Name, f.Domain, f.Descriptors)
	}
	var out []*Error
	checks := 0
	for _, g := range order {
		ws := groups[g]
		for j := 1; j < len(ws); j++ {
			later := ws[j]
			for _, earlier := range ws[:j] {
				if literalLen(later.d.Value) <= literalLen(earlier.d.Value) {
					continue // both precedences pick the earlier one
				}
				if checks++; checks > maxOverlapChecks {
					return append(out, &Error{File: later.file, Line: later.d.Line, Path: later.d.Path, Msg: fmt.Sprintf(
						"stopped looking for overlapping wildcards after %d pairs; the rest are not checked", maxOverlapChecks)})
				}
				if !globsOverlap(earlier.d.Value, later.d.Value) {
					continue
				}
				winner := fmt.Sprintf("those values take %q's limits, as envoyproxy/ratelimit does (WILDCARD_PRECEDENCE=first); "+
					"put this one first to give them its own", earlier.d.Value)
				if prec == WildcardMostLiteral {
					winner = "those values take this one's limits here (WILDCARD_PRECEDENCE=most_literal); " +
						"envoyproxy/ratelimit would give them the first one's"
				}
				out = append(out, &Error{File: later.file, Line: later.d.Line, Path: later.d.Path, Msg: fmt.Sprintf(
					"wildcard %q overlaps %q (%s:%d), which comes first: %s", later.d.Value, earlier.d.Value,
					earlier.file, earlier.d.Line, winner)})
			}
		}
	}
	return out
}

func literalLen(pattern string) int { return len(pattern) - strings.Count(pattern, "*") }

// globsOverlap reports whether some string matches both patterns, where
// '*' matches any run of bytes. It walks the two patterns' automata in
// step: a state is a position in each pattern, a star stays put on any
// byte or is passed for free, a literal byte advances on itself. Bytes
// outside both patterns behave alike, so one stands for them all.
func globsOverlap(a, b string) bool {
	// Cheap refusals first: the literal prefixes (and suffixes) must agree
	// as far as both go.
	pa, pb := a[:strings.IndexByte(a+"*", '*')], b[:strings.IndexByte(b+"*", '*')]
	if !strings.HasPrefix(pa, pb) && !strings.HasPrefix(pb, pa) {
		return false
	}
	sa, sb := a[strings.LastIndexByte(a, '*')+1:], b[strings.LastIndexByte(b, '*')+1:]
	if !strings.HasSuffix(sa, sb) && !strings.HasSuffix(sb, sa) {
		return false
	}
	if (len(a)+1)*(len(b)+1) > maxOverlapStates {
		return true // too long to walk: the prefixes and suffixes agree, so say they may
	}
	alphabet := globAlphabet(a, b)
	w := len(b) + 1
	visited := make([]bool, (len(a)+1)*w)
	var stack []int
	push := func(i, j int) {
		// Passing stars is free: push every state reachable that way.
		for ; ; i++ {
			for jj := j; ; jj++ {
				if !visited[i*w+jj] {
					visited[i*w+jj] = true
					stack = append(stack, i*w+jj)
				}
				if jj == len(b) || b[jj] != '*' {
					break
				}
			}
			if i == len(a) || a[i] != '*' {
				break
			}
		}
	}
	push(0, 0)
	for len(stack) > 0 {
		s := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		i, j := s/w, s%w
		if i == len(a) && j == len(b) {
			return true
		}
		for _, c := range alphabet {
			ni, nj := step(a, i, c), step(b, j, c)
			if ni >= 0 && nj >= 0 {
				push(ni, nj)
			}
		}
	}
	return false
}

// globAlphabet is the bytes the walk tries: each literal byte of a and b,
// and one byte in neither, if any, standing for all the others.
func globAlphabet(a, b string) []byte {
	var alphabet []byte
	var seen [256]bool
	for _, c := range []byte(a + b) {
		if c != '*' && !seen[c] {
			seen[c] = true
			alphabet = append(alphabet, c)
		}
	}
	for c := 0; c < 256; c++ {
		if !seen[c] && c != '*' {
			alphabet = append(alphabet, byte(c))
			break
		}
	}
	return alphabet
}

// step is where pattern p goes from position i on byte c, or -1.
func step(p string, i int, c byte) int {
	switch {
	case i == len(p):
		return -1
	case p[i] == '*':
		return i
	case p[i] == c:
		return i + 1
	}
	return -1
}
