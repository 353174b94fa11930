package config

import (
	"strings"

	"github.com/openrls/ratelimit/src/config/internal/arena"
)

// packer lays a config's many small objects out in few large ones (see
// package arena): a node, its limits, their slice and half a dozen strings
// per rule. The decoder packs the descriptors, strings and limits it reads
// (the parsed file of 100,000 rules was 400,000 objects more while it
// loaded); Build keeps the limits (a copy would add their size to the
// load's peak) and packs the rest anew, leaving the parsed file to be freed
// whole. A packer serves one decoder or one Build.
type packer struct {
	text   arena.Text
	nodes  arena.Slab[Node]
	descs  arena.Slab[Descriptor]
	limits arena.Slab[Limit]
	ptrs   arena.Slab[*Limit]
	parts  arena.Slab[string]
	keys   map[string]string // descriptor keys: few, repeated on every rule
}

// expecting returns a packer whose first descriptor and limit blocks hold
// n: a piece of a file knows how many items it decodes.
func expecting(n int) packer {
	var p packer
	p.descs.First, p.limits.First, p.ptrs.First = n, n, n
	return p
}

// str returns s copied into the current text block.
func (p *packer) str(s string) string { return p.text.String(s) }

// key returns the one copy of a descriptor key.
func (p *packer) key(k string) string {
	if s, ok := p.keys[k]; ok {
		return s
	}
	if p.keys == nil {
		p.keys = map[string]string{}
	}
	s := p.str(k)
	p.keys[s] = s
	return s
}

// node returns a zero node in the current node block.
func (p *packer) node() *Node { return p.nodes.New() }

// descriptor returns a zero descriptor in the current descriptor block.
func (p *packer) descriptor() *Descriptor { return p.descs.New() }

// limit returns a zero limit in the current limit block.
func (p *packer) limit() *Limit { return p.limits.New() }

// limitList returns ls copied into the current block of limit pointers.
func (p *packer) limitList(ls []*Limit) []*Limit { return p.ptrs.Copy(ls...) }

// split returns s split at every '*', its parts in the current part block.
func (p *packer) split(s string) []string { return p.parts.Copy(strings.Split(s, "*")...) }
