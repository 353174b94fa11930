package config

import (
	"slices"
	"strings"
)

// wildIndex holds one key's wildcard values at one level so that matching
// costs the same whatever their number. A pattern is filed under its
// literal prefix (the text before its first '*'): a value can only match
// patterns whose prefix it starts with, so matching looks up the value's
// prefix of each length some pattern has, usually a handful. Patterns with
// no prefix are filed under their literal suffix the same way; the rest
// ("*", "*x*") are tried in turn. Each list is in precedence order, which
// is what the whole level's precedence is (see find): config order, as
// envoyproxy/ratelimit matches, or under WildcardMostLiteral most literal
// characters first, then config order.
type wildIndex struct {
	all        []*Node          // config order
	byValue    map[string]*Node // pattern → node, for duplicate checks
	byPrefix   map[string][]*Node
	prefixLens []int // distinct prefix lengths, ascending
	bySuffix   map[string][]*Node
	suffixLens []int
	rest       []*Node
}

// add files n, whose wildcard holds its pattern split at '*'.
func (w *wildIndex) add(n *Node) {
	n.literal = len(n.value) - strings.Count(n.value, "*")
	n.seq = len(w.all)
	w.all = append(w.all, n)
	if w.byValue == nil {
		w.byValue, w.byPrefix, w.bySuffix = map[string]*Node{}, map[string][]*Node{}, map[string][]*Node{}
	}
	w.byValue[n.value] = n
	prefix, suffix := n.wildcard[0], n.wildcard[len(n.wildcard)-1]
	switch {
	case prefix != "":
		w.byPrefix[prefix] = append(w.byPrefix[prefix], n)
		w.prefixLens = insertLen(w.prefixLens, len(prefix))
	case suffix != "":
		w.bySuffix[suffix] = append(w.bySuffix[suffix], n)
		w.suffixLens = insertLen(w.suffixLens, len(suffix))
	default:
		w.rest = append(w.rest, n)
	}
}

func insertLen(lens []int, l int) []int {
	i, found := slices.BinarySearch(lens, l)
	if found {
		return lens
	}
	return slices.Insert(lens, i, l)
}

// seal puts every list in precedence order. It runs once per level when the
// config is built, not on every insert: 20,000 wildcards sorted on every
// insert took seconds.
func (w *wildIndex) seal(prec WildcardPrecedence) {
	for _, n := range w.all {
		n.rank = 0
		if prec == WildcardMostLiteral {
			n.rank = n.literal
		}
	}
	for _, ns := range w.byPrefix {
		slices.SortFunc(ns, byPrecedence)
	}
	for _, ns := range w.bySuffix {
		slices.SortFunc(ns, byPrecedence)
	}
	slices.SortFunc(w.rest, byPrecedence)
}

// byPrecedence orders wildcard nodes best first: higher rank, then config
// order.
func byPrecedence(a, b *Node) int {
	if a.rank != b.rank {
		return b.rank - a.rank
	}
	return a.seq - b.seq
}

// better reports whether a takes precedence over b (nil loses to anything).
func better(a, b *Node) bool { return b == nil || byPrecedence(a, b) < 0 }

// match returns the best wildcard that matches value, or nil.
func (w *wildIndex) match(value string) *Node {
	var best *Node
	for _, l := range w.prefixLens {
		if l > len(value) {
			break
		}
		best = bestIn(w.byPrefix[value[:l]], value, best)
	}
	for _, l := range w.suffixLens {
		if l > len(value) {
			break
		}
		best = bestIn(w.bySuffix[value[len(value)-l:]], value, best)
	}
	return bestIn(w.rest, value, best)
}

// bestIn returns the first node of ns (in precedence order) that matches
// value and beats best, or best.
func bestIn(ns []*Node, value string, best *Node) *Node {
	for _, n := range ns {
		if !better(n, best) {
			return best // the rest of ns is no better
		}
		if globMatch(n.wildcard, value) {
			return n
		}
	}
	return best
}
