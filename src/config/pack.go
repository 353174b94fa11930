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
// blocks. The decoder packs the descriptors, strings and limits it reads
// (the parsed file of 100,000 rules was 400,000 objects more while it
// loaded); Build keeps the limits (a copy would add their size to the
// load's peak) and packs the rest anew, leaving the parsed file to be freed
// whole. A packer serves one decoder or one Build; the blocks it hands out
// from only grow, so what it handed out is never moved or written over.
type packer struct {
	text   []byte // current block of string bytes
	nodes  []Node // current block of nodes
	descs  []Descriptor
	limits []Limit // current block of limits
	ptrs   []*Limit
	parts  []string
	keys   map[string]string // descriptor keys: few, repeated on every rule
	// expect, when set, sizes the first descriptor and limit blocks: a
	// piece of a file knows how many items it decodes, and a block half
	// used at the end of each of 200 pieces wasted a sixth of a large
	// config's memory.
	expect int
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

// take returns the next zero item of *block, starting a new block of
// size(cap) items when it is full (the full one stays with what it gave).
func take[T any](block *[]T, size func(prev int) int) *T {
	if len(*block) == cap(*block) {
		*block = make([]T, 0, size(cap(*block)))
	}
	*block = (*block)[:len(*block)+1]
	return &(*block)[len(*block)-1]
}

// node returns a zero node in the current node block.
func (p *packer) node() *Node {
	return take(&p.nodes, func(prev int) int { return blockSize(prev, 1, packItemsMax) })
}

// descriptor returns a zero descriptor in the current descriptor block.
func (p *packer) descriptor() *Descriptor {
	return take(&p.descs, func(prev int) int { return p.nextBlock(prev, 1) })
}

// nextBlock sizes a descriptor or limit block: the expected count first,
// if known.
func (p *packer) nextBlock(prev, need int) int {
	if prev == 0 && p.expect > 0 {
		return max(min(p.expect, packItemsMax), need)
	}
	return blockSize(prev, need, packItemsMax)
}

// limit returns a zero limit in the current limit block.
func (p *packer) limit() *Limit {
	return take(&p.limits, func(prev int) int { return p.nextBlock(prev, 1) })
}

// limitList returns ls copied into the current block of limit pointers.
func (p *packer) limitList(ls []*Limit) []*Limit {
	if len(ls) == 0 {
		return nil
	}
	if len(p.ptrs)+len(ls) > cap(p.ptrs) {
		p.ptrs = make([]*Limit, 0, p.nextBlock(cap(p.ptrs), len(ls)))
	}
	start := len(p.ptrs)
	p.ptrs = append(p.ptrs, ls...)
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
