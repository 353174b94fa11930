package config

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"sync"

	"gopkg.in/yaml.v3"
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

// item is one top-level descriptors item: lines [start, end) of the file,
// 0-based.
type item struct{ start, end int }

// lineIndex indexes a file's lines by where each starts: line i is
// data[at[i]:at[i+1]], its newline included. An offset a line, not a slice
// (a third of the size: 300,000 lines held 7 MB of slice headers at the
// load's peak), and a run of lines is one slice of data, never a copy.
type lineIndex struct {
	data []byte
	at   []int
}

func splitLines(data []byte) lineIndex {
	at := make([]int, 1, bytes.Count(data, []byte("\n"))+2)
	for i, c := range data {
		if c == '\n' {
			at = append(at, i+1)
		}
	}
	if at[len(at)-1] != len(data) {
		at = append(at, len(data)) // a last line without a newline
	}
	return lineIndex{data, at}
}

// n is the number of lines.
func (ls lineIndex) n() int { return len(ls.at) - 1 }

// line returns line i.
func (ls lineIndex) line(i int) []byte { return ls.data[ls.at[i]:ls.at[i+1]] }

// span returns lines [a, b) as one slice of the file.
func (ls lineIndex) span(a, b int) []byte { return ls.data[ls.at[a]:ls.at[b]] }

// parseInChunks parses data as Parse does, in pieces of per items, if it
// holds at least minBytes; taken is false when it declines (see above).
func parseInChunks(name string, data []byte, minBytes, per int) (f *File, taken bool, err error) {
	if len(data) < minBytes || !plainYAML(data) {
		return nil, false, nil
	}
	lines := splitLines(data)
	items, ok := splitItems(lines)
	if !ok || len(items) == 0 {
		return nil, false, nil
	}
	// The rest of the file, item lines blanked: domain and top-level
	// errors from the whole-document decode, the descriptors key null.
	skeleton := make([]byte, 0, len(data)/8)
	for i := range lines.n() {
		if inItems(items, i) {
			skeleton = append(skeleton, '\n')
			continue
		}
		skeleton = append(skeleton, lines.line(i)...)
	}
	f, err = parseWhole(name, skeleton)
	if f == nil || f.Descriptors != nil || err != nil && strings.Contains(err.Error(), ": descriptors") {
		// Not a mapping, invalid (the whole decode says why), or the
		// descriptors key not empty once its items are blanked: not the
		// shape this split understands.
		return nil, false, nil
	}
	pieces := make([][]decoded, (len(items)+per-1)/per)
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
			return nil, false, nil
		}
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

// decoded is one item as decoded: its Descriptor (nil if it has none) and
// its errors.
type decoded struct {
	desc *Descriptor
	errs []error
}

// decodePiece decodes the items its (first is the index of its[0] in the
// list) as one list, then each item as Parse would; declined when the piece
// does not decode on its own or holds an anchor or alias after all.
func decodePiece(name string, lines lineIndex, its []item, first int) ([]decoded, bool) {
	// The items' lines, with the blank and comment lines between them, so
	// that lines in the piece count from its first line.
	var doc yaml.Node
	if err := yaml.Unmarshal(lines.span(its[0].start, its[len(its)-1].end), &doc); err != nil || len(doc.Content) != 1 {
		return nil, true
	}
	seq := doc.Content[0]
	// Lines in the piece count from its first item's line.
	if seq.Kind != yaml.SequenceNode || len(seq.Content) != len(its) || !shiftLines(seq, its[0].start) {
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
// is an anchor or an alias (plainYAML may miss one behind a quote it
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

// plainYAML reports whether data avoids every construct that ties list
// items together or that a line-based split could misread: anchors,
// aliases, tags, tabs, document markers, directives, any line break but
// "\n" (the YAML parser also breaks lines at CR, NEL, LS and PS, even in a
// comment, where a split at "\n" alone would not), and any line that is
// not valid UTF-8 text (left to the decoder's own errors).
func plainYAML(data []byte) bool {
	if bytes.IndexByte(data, '\t') >= 0 || bytes.IndexByte(data, '\r') >= 0 || bytes.Contains(data, nel) ||
		bytes.Contains(data, lineSep) || bytes.Contains(data, paraSep) {
		return false
	}
	inQuote := byte(0)
	for i := 0; i < len(data); i++ {
		c := data[i]
		if inQuote != 0 {
			switch {
			case c == '\\' && inQuote == '"':
				i++ // an escape: the next byte is not the closing quote
			case c == inQuote:
				inQuote = 0
			}
			continue
		}
		switch c {
		case '"', '\'':
			// Only a quote that opens a scalar (after indentation, a
			// flow indicator, ": " or "- ") starts quoting; an apostrophe
			// inside a plain scalar does not.
			if i == 0 || bytes.IndexByte([]byte(" \n[{,:"), data[i-1]) >= 0 {
				inQuote = c
			}
		case '#':
			if i == 0 || data[i-1] == ' ' || data[i-1] == '\n' {
				// A comment: skip to the end of the line.
				for i < len(data) && data[i] != '\n' {
					i++
				}
			}
		case '&', '*', '!', '%', '@', '`', '|', '>':
			// Indicators where a token may start: an anchor, alias,
			// tag, directive, reserved, or a block scalar.
			if i == 0 || bytes.IndexByte([]byte(" \n[{,"), data[i-1]) >= 0 {
				return false
			}
		case '-', '.':
			// A document marker: "---" or "..." at the start of a line.
			if (i == 0 || data[i-1] == '\n') && bytes.HasPrefix(data[i:], []byte{c, c, c}) {
				return false
			}
		}
	}
	return inQuote == 0
}

// The line breaks besides LF and CR that the YAML parser honours, in UTF-8:
// NEL (U+0085), LS (U+2028) and PS (U+2029).
var (
	nel     = []byte("\u0085")
	lineSep = []byte("\u2028")
	paraSep = []byte("\u2029")
)

// splitItems finds the lines of the top-level descriptors list's items.
// ok is false unless descriptors is a block list at the top level whose
// items start with "- " at one indentation and whose lines are all
// indented more than that but for each item's first.
func splitItems(lines lineIndex) (items []item, ok bool) {
	start := -1
	for i := range lines.n() {
		l := lines.line(i)
		if t := bytes.TrimLeft(l, " "); len(t) < len(l) && len(bytes.TrimSpace(t)) != 0 && t[0] != '#' && start < 0 {
			return nil, false // the top-level mapping is not at the left edge
		}
		if r, found := bytes.CutPrefix(l, []byte("descriptors:")); found {
			// Nothing more on the line but a comment, after a space.
			if v := bytes.TrimSpace(r); len(v) != 0 && (v[0] != '#' || r[0] != ' ') {
				return nil, false // a flow list, a value, or another key
			}
			start = i + 1
			break
		}
	}
	if start < 0 {
		return nil, false
	}
	indent := -1
	cur := -1
	end := lines.n()
	for i := start; i < lines.n(); i++ {
		l := lines.line(i)
		t := bytes.TrimLeft(l, " ")
		if len(bytes.TrimSpace(t)) == 0 || t[0] == '#' {
			continue // blank or comment: belongs to whatever it is in
		}
		col := len(l) - len(t)
		if indent < 0 {
			indent = col
		}
		isItem := col == indent && (bytes.HasPrefix(t, []byte("- ")) || bytes.Equal(bytes.TrimRight(t, "\n"), []byte("-")))
		switch {
		case isItem:
			if cur >= 0 {
				items = append(items, item{cur, trimTail(lines, cur, i)})
			}
			cur = i
		case col > indent && cur >= 0:
			// inside the current item
		case col == 0 && (indent > 0 || !isItem):
			if !keyLine(t) {
				return nil, false // a continuation, or not a key: leave it to the whole decode
			}
			end = i // the next top-level key
			i = lines.n()
		default:
			return nil, false
		}
	}
	if cur >= 0 {
		items = append(items, item{cur, trimTail(lines, cur, end)})
	}
	return items, true
}

// keyLine reports whether t, a line at the left edge, is plainly a
// mapping key: a plain key followed by ": " or the line's end.
func keyLine(t []byte) bool {
	if bytes.IndexByte([]byte("-[]{}?:,#&*!|>'\"%@`"), t[0]) >= 0 {
		return false
	}
	t = bytes.TrimRight(t, "\n")
	i := bytes.IndexByte(t, ':')
	return i > 0 && (i == len(t)-1 || t[i+1] == ' ')
}

// trimTail ends an item before the blank and comment lines that follow it,
// which the skeleton keeps.
func trimTail(lines lineIndex, start, end int) int {
	for end > start+1 {
		t := bytes.TrimSpace(lines.line(end - 1))
		if len(t) != 0 && t[0] != '#' {
			break
		}
		end--
	}
	return end
}

// inItems reports whether line i is part of an item (items sorted).
func inItems(items []item, i int) bool {
	lo, hi := 0, len(items)
	for lo < hi {
		m := (lo + hi) / 2
		switch {
		case i < items[m].start:
			hi = m
		case i >= items[m].end:
			lo = m + 1
		default:
			return true
		}
	}
	return false
}
