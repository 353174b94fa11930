// Package yamlsplit finds the top-level items of a config file's
// descriptors list from their lines, so that config can decode a large file
// a few hundred items at a time (see config's parseInChunks). It reads
// lines and indentation only and declines (Plain false, Items ok false)
// every shape a line-based reading could get wrong; what to do then is the
// caller's.
package yamlsplit

import "bytes"

// Item is one top-level descriptors item: lines [Start, End) of the file,
// 0-based.
type Item struct{ Start, End int }

// Lines indexes a file's lines by where each starts: line i is
// data[at[i]:at[i+1]], its newline included. An offset a line, not a slice
// (a third of the size: 300,000 lines held 7 MB of slice headers at the
// load's peak), and a run of lines is one slice of data, never a copy.
type Lines struct {
	data []byte
	at   []int
}

// Index indexes data's lines.
func Index(data []byte) Lines {
	at := make([]int, 1, bytes.Count(data, []byte("\n"))+2)
	for i, c := range data {
		if c == '\n' {
			at = append(at, i+1)
		}
	}
	if at[len(at)-1] != len(data) {
		at = append(at, len(data)) // a last line without a newline
	}
	return Lines{data, at}
}

// N is the number of lines.
func (ls Lines) N() int { return len(ls.at) - 1 }

// Line returns line i.
func (ls Lines) Line(i int) []byte { return ls.data[ls.at[i]:ls.at[i+1]] }

// Span returns lines [a, b) as one slice of the file.
func (ls Lines) Span(a, b int) []byte { return ls.data[ls.at[a]:ls.at[b]] }

// Plain reports whether data avoids every construct that ties list
// items together or that a line-based split could misread: anchors,
// aliases, tags, tabs, document markers, directives, any line break but
// "\n" (the YAML parser also breaks lines at CR, NEL, LS and PS, even in a
// comment, where a split at "\n" alone would not), and any line that is
// not valid UTF-8 text (left to the decoder's own errors).
func Plain(data []byte) bool {
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

// Items finds the lines of the top-level descriptors list's items.
// ok is false unless descriptors is a block list at the top level whose
// items start with "- " at one indentation and whose lines are all
// indented more than that but for each item's first.
func Items(lines Lines) (items []Item, ok bool) {
	start := -1
	for i := range lines.N() {
		l := lines.Line(i)
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
	end := lines.N()
	for i := start; i < lines.N(); i++ {
		l := lines.Line(i)
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
				items = append(items, Item{cur, trimTail(lines, cur, i)})
			}
			cur = i
		case col > indent && cur >= 0:
			// inside the current item
		case col == 0 && (indent > 0 || !isItem):
			if !keyLine(t) {
				return nil, false // a continuation, or not a key: leave it to the whole decode
			}
			end = i // the next top-level key
			i = lines.N()
		default:
			return nil, false
		}
	}
	if cur >= 0 {
		items = append(items, Item{cur, trimTail(lines, cur, end)})
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
func trimTail(lines Lines, start, end int) int {
	for end > start+1 {
		t := bytes.TrimSpace(lines.Line(end - 1))
		if len(t) != 0 && t[0] != '#' {
			break
		}
		end--
	}
	return end
}

// Covered reports whether line i is part of an item (items sorted).
func Covered(items []Item, i int) bool {
	lo, hi := 0, len(items)
	for lo < hi {
		m := (lo + hi) / 2
		switch {
		case i < items[m].Start:
			hi = m
		case i >= items[m].End:
			lo = m + 1
		default:
			return true
		}
	}
	return false
}
