package config

import (
	"fmt"

	"gopkg.in/yaml.v3"
)

// YAML aliases let a short file describe a huge tree: seven levels of ten
// aliases each name ten million descriptors in about 600 bytes, and an alias
// inside the node it names describes an infinite one. The decoder expands
// aliases as it walks, so before it walks, checkAliases bounds the expanded
// tree by the written one.

const (
	// aliasExpansion is how many times its written nodes a file may expand
	// to through aliases. Sharing a rate_limit block among many descriptors
	// expands a file by about 1.2 times; a plan of 20 limited routes reused
	// for each of 300 tenants by 27 times.
	aliasExpansion = 64
	// aliasFloor lets small files use aliases freely: up to this many nodes
	// are always allowed (a few MB of config structures at most).
	aliasFloor = 10_000
)

// checkAliases returns an error naming the alias at which the tree under
// root, aliases expanded, grows past its budget (aliasExpansion times the
// written nodes, at least aliasFloor), or the alias that refers to a node
// containing itself. Its cost is linear in the written nodes.
func checkAliases(file string, root *yaml.Node) error {
	sizes := map[*yaml.Node]int{}
	written := countWritten(root)
	budget := max(aliasExpansion*written, aliasFloor)
	var cyclic *yaml.Node
	var size func(n *yaml.Node) int
	size = func(n *yaml.Node) int {
		if n.Kind == yaml.AliasNode {
			n = n.Alias
			if n == nil {
				return 1
			}
		}
		if s, ok := sizes[n]; ok {
			if s < 0 && cyclic == nil {
				cyclic = n
			}
			return max(s, 0)
		}
		sizes[n] = -1 // in progress: reaching it again is a cycle
		total := 1
		for _, c := range n.Content {
			total = min(total+size(c), budget+1) // saturate: 10^N fits no int
		}
		sizes[n] = total
		return total
	}
	var over *yaml.Node
	count := 0
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if over != nil || cyclic != nil {
			return
		}
		if n.Kind == yaml.AliasNode {
			if count += size(n); count > budget || cyclic != nil {
				over = n
			}
			return
		}
		count++
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(root)
	switch {
	case cyclic != nil:
		return &Error{File: file, Line: over.Line, Msg: fmt.Sprintf(
			"alias *%s refers to a node that contains it (anchored at line %d): the tree would be infinite", over.Value, cyclic.Line)}
	case over != nil:
		return &Error{File: file, Line: over.Line, Msg: fmt.Sprintf(
			"aliases expand this file past %d nodes (%d times the %d written, at least %d) at alias *%s; write repeated parts out or alias less deeply",
			budget, aliasExpansion, written, aliasFloor, over.Value)}
	}
	return nil
}

// countWritten counts the nodes as written, each alias once.
func countWritten(n *yaml.Node) int {
	total := 1
	if n.Kind != yaml.AliasNode {
		for _, c := range n.Content {
			total += countWritten(c)
		}
	}
	return total
}
