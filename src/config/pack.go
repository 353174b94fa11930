package config

import (
	"strings"
	"unsafe"
)

// packer lays a config's many small objects out in few large ones. The
// collector marks every live object on each cycle the service runs, and a
// 100,000-rule config built object by object was 740,000 of them (a node,
// its limits, their slice and half a dozen strings per rule), all live for
// as long as the config serves. Packed, the same config is a few hundred
// blocks, and the parsed file's strings and limits are left to be freed.
// One packer serves one Build; what it hands out is never written again.
type packer struct {
	text   []byte  // current block of string bytes
	nodes  []Node  // current block of nodes
	limits []Limit // current block of limits
	ptrs   []*Limit
	parts  []string
	keys   map[string]string // descriptor keys: few, repeated on every rule
}

// Blocks grow from small (a config of a few rules stays small) to these
// sizes, which keep the waste of a half-used last block low.
const (
	packTextMax  = 64 << 10
	packItemsMax = 1024
)

// blockSize returns the next block's size: double the previous, at most
// limit, but at least need.
func blockSize(prev, need, limit int) int {
	return max(min(2*prev, limit), need, 16)
}

// str returns s copied into the current text block.
func (p *packer) str(s string) string {
	if s == "" {
		return ""
	}
	if len(p.text)+len(s) > cap(p.text) {
		p.text = make([]byte, 0, blockSize(cap(p.text), len(s), packTextMax))
	}
	off := len(p.text)
	p.text = append(p.text, s...)
	// The bytes under the string are never written again: a block only
	// grows past them, and a full block is replaced, not reused.
	return unsafe.String(&p.text[off], len(s))
}

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
func (p *packer) node() *Node {
	if len(p.nodes) == cap(p.nodes) {
		p.nodes = make([]Node, 0, blockSize(cap(p.nodes), 1, packItemsMax))
	}
	p.nodes = p.nodes[:len(p.nodes)+1]
	return &p.nodes[len(p.nodes)-1]
}

// copyLimits returns copies of ls in the current limit block, so that the
// config neither holds nor changes the parsed file's limits.
func (p *packer) copyLimits(ls []*Limit) []*Limit {
	if len(ls) == 0 {
		return nil
	}
	if len(p.ptrs)+len(ls) > cap(p.ptrs) {
		p.ptrs = make([]*Limit, 0, blockSize(cap(p.ptrs), len(ls), packItemsMax))
	}
	start := len(p.ptrs)
	for _, l := range ls {
		if len(p.limits) == cap(p.limits) {
			p.limits = make([]Limit, 0, blockSize(cap(p.limits), 1, packItemsMax))
		}
		p.limits = append(p.limits, *l)
		c := &p.limits[len(p.limits)-1]
		c.Name, c.identity = p.str(c.Name), p.str(c.identity)
		p.ptrs = append(p.ptrs, c)
	}
	return p.ptrs[start:len(p.ptrs):len(p.ptrs)]
}

// split returns s split at every '*', its parts in the current part block.
func (p *packer) split(s string) []string {
	n := strings.Count(s, "*") + 1
	if len(p.parts)+n > cap(p.parts) {
		p.parts = make([]string, 0, blockSize(cap(p.parts), n, packItemsMax))
	}
	start := len(p.parts)
	for {
		i := strings.IndexByte(s, '*')
		if i < 0 {
			break
		}
		p.parts = append(p.parts, s[:i])
		s = s[i+1:]
	}
	p.parts = append(p.parts, s)
	return p.parts[start:len(p.parts):len(p.parts)]
}
