package config

import (
	"fmt"
	"runtime"
	"strings"
	"sync"

	"gopkg.in/yaml.v3"

	"github.com/openrls/ratelimit/src/config/internal/yamlsplit"
)

// Large files in pieces
//
// yaml.v3 decodes a document into a node tree of about 35 times the file
// (100,000 rules: 340 MB to load a 9 MB file, and most of the time spent
// allocating it). A config file is one mapping whose bulk is one block list,
// descriptors, whose items are independent of each other unless aliases tie
// them. parseInChunks finds the items' boundaries from their indentation,
// decodes them a few hundred at a time, on every core, and turns each piece
// into Descriptors before the next is decoded: the node trees in memory at
// once are a few pieces', whatever the file's size. What is left of the file
// (domain, comments, the descriptors key) is decoded as written, with the
// items' lines blanked, so line numbers hold throughout.
//
// It declines (ok false), leaving the file to Parse's whole-document decode,
// whenever the shape is not that plain: any anchor, alias, tag, tab, document
// marker or directive; a descriptors value other than a block list; a piece
// that does not decode on its own (the whole-document decode then reports
// the syntax error as it always has). What it accepts decodes to exactly
// what the whole-document decode gives, errors included (TestChunksMatchWhole
// and FuzzChunks check it).

const (
	// chunkItems is how many list items one piece holds.
	chunkItems = 512
	// chunkMin is the smallest file parsed in pieces; below it the whole
	// document is small anyway.
	chunkMin = 256 << 10
)

// parseInChunks parses data as Parse does, in pieces of per items, if it
// holds at least minBytes; taken is false when it declines (see above).
func parseInChunks(name string, data []byte, minBytes, per int) (f *File, taken bool, err error) {
	if len(data) < minBytes || !yamlsplit.Plain(data) {
		return nil, false, nil
	}
	lines := yamlsplit.Index(data)
	items, ok := yamlsplit.Items(lines)
	if !ok || len(items) == 0 {
		return nil, false, nil
	}
	// The rest of the file, item lines blanked: domain and top-level
	// errors from the whole-document decode, the descriptors key null.
	skeleton := make([]byte, 0, len(data)/8)
	for i := range lines.N() {
		if yamlsplit.Covered(items, i) {
			skeleton = append(skeleton, '\n')
			continue
		}
		skeleton = append(skeleton, lines.Line(i)...)
	}
	f, err = parseWhole(name, skeleton)
	if f == nil || f.Descriptors != nil || err != nil && strings.Contains(err.Error(), ": descriptors") {
		// Not a mapping, invalid (the whole decode says why), or the
		// descriptors key not empty once its items are blanked: not the
		// shape this split understands.
		return nil, false, nil
	}
	pieces, ok := decodeAll(name, lines, items, per)
	if !ok {
		return nil, false, nil
	}
	// In file order, each item's errors then its duplicate check, as
	// descriptors reports them; the skeleton's errors (domain) first.
	d := &decoder{file: name}
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		d.errs = append(d.errs, joined.Unwrap()...)
	} else if err != nil {
		d.errs = append(d.errs, err)
	}
	f.Descriptors = make([]*Descriptor, 0, len(items))
	seen := make(map[[2]string]int, len(items))
	for p, piece := range pieces {
		pieces[p] = nil // the piece's errors and slots go as they are taken
		for _, it := range piece {
			d.errs = append(d.errs, it.errs...)
			if it.desc != nil && d.unique(seen, it.desc) {
				f.Descriptors = append(f.Descriptors, it.desc)
			}
		}
	}
	return f, true, d.err()
}

// decodeAll decodes items in pieces of per, on every core; ok is false if
// any piece declined.
func decodeAll(name string, lines yamlsplit.Lines, items []yamlsplit.Item, per int) (pieces [][]decoded, ok bool) {
	pieces = make([][]decoded, (len(items)+per-1)/per)
	declined := make([]bool, len(pieces))
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(runtime.GOMAXPROCS(0), len(pieces)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range next {
				first := p * per
				its := items[first:min(first+per, len(items))]
				pieces[p], declined[p] = decodePiece(name, lines, its, first)
			}
		}()
	}
	for p := range pieces {
		next <- p
	}
	close(next)
	wg.Wait()
	for _, no := range declined {
		if no {
			return nil, false
		}
	}
	return pieces, true
}

// decoded is one item as decoded: its Descriptor (nil if it has none) and
// its errors.
type decoded struct {
	desc *Descriptor
	errs []error
}

// decodePiece decodes the items its (first is the index of its[0] in the
// list) as one list, then each item as Parse would; declined when the piece
// does not decode on its own or holds an anchor or alias after all.
func decodePiece(name string, lines yamlsplit.Lines, its []yamlsplit.Item, first int) ([]decoded, bool) {
	// The items' lines, with the blank and comment lines between them, so
	// that lines in the piece count from its first line.
	var doc yaml.Node
	if err := yaml.Unmarshal(lines.Span(its[0].Start, its[len(its)-1].End), &doc); err != nil || len(doc.Content) != 1 {
		return nil, true
	}
	seq := doc.Content[0]
	// Lines in the piece count from its first item's line.
	if seq.Kind != yaml.SequenceNode || len(seq.Content) != len(its) || !shiftLines(seq, its[0].Start) {
		return nil, true
	}
	d := &decoder{file: name, depth: 1, pack: expecting(len(its))}
	out := make([]decoded, len(its))
	for i, n := range seq.Content {
		out[i].desc = d.descriptor(n, fmt.Sprintf("descriptors[%d]", first+i))
		out[i].errs, d.errs = d.errs, nil
	}
	return out, false
}

// shiftLines adds offset to the line of every node under n; false if one
// is an anchor or an alias (yamlsplit.Plain may miss one behind a quote it
// cannot tell from an apostrophe).
func shiftLines(n *yaml.Node, offset int) bool {
	if n.Anchor != "" || n.Kind == yaml.AliasNode {
		return false
	}
	n.Line += offset
	for _, c := range n.Content {
		if !shiftLines(c, offset) {
			return false
		}
	}
	return true
}
