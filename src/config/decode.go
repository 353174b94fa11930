package config

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// decoder walks a yaml.Node tree and collects positioned errors. It decodes
// by hand rather than into structs because yaml.v3 reports unknown fields
// without a path and Node.Decode does not honour KnownFields.
type decoder struct {
	file  string
	errs  []error
	depth int // of the descriptor list being decoded
	// pack lays out the descriptors, strings and limits decoded in
	// blocks; the built config keeps the limits (see pack.go).
	pack packer
}

func (d *decoder) err() error { return errors.Join(d.errs...) }

func (d *decoder) errAt(line int, path, format string, args ...any) {
	d.errs = append(d.errs, &Error{File: d.file, Line: line, Path: path, Msg: sprintf(format, args...)})
}

func (d *decoder) errf(n *yaml.Node, path, format string, args ...any) {
	line := 0
	if n != nil {
		line = n.Line
	}
	d.errAt(line, path, format, args...)
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// yamlError turns a yaml.v3 syntax error in data into a positioned *Error,
// at the line syntaxLine finds.
func (d *decoder) yamlError(err error, data []byte) error {
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &Error{File: d.file, Line: syntaxLine(data, line, m[2]), Msg: "invalid YAML: " + m[2]}
	}
	return &Error{File: d.file, Msg: "invalid YAML: " + err.Error()}
}

// syntaxLine is the line a yaml.v3 syntax error is about. yaml.v3 names
// the line of the error's context, counted from 0 for the parser's errors
// ("did not find expected ..."), from 1 for the scanner's: the line of an
// unclosed bracket comes out one early, and a bad line inside a block list,
// or a tab, as the line where the list starts. It returns the 1-based line
// of the bracket, of the first line of the list out of line, of the tab,
// or what yaml.v3 said.
func syntaxLine(data []byte, reported int, msg string) int {
	lines := strings.Split(string(data), "\n")
	indent := func(l string) int { return len(l) - len(strings.TrimLeft(l, " ")) }
	blank := func(l string) bool { t := strings.TrimSpace(l); return t == "" || t[0] == '#' }
	last := len(lines)
	for last > 1 && blank(lines[last-1]) {
		last--
	}
	switch {
	case strings.Contains(msg, "tab character"):
		for k := max(reported, 1); k <= len(lines); k++ {
			if l := lines[k-1]; strings.ContainsRune(l[:len(l)-len(strings.TrimLeft(l, " \t"))], '\t') {
				return k
			}
		}
	case strings.HasPrefix(msg, "did not find expected '-' indicator"):
		start := reported + 1 // the list's first item
		if start > len(lines) {
			break
		}
		dash := indent(lines[start-1])
		for k := start + 1; k <= len(lines); k++ {
			l := lines[k-1]
			if blank(l) {
				continue
			}
			ind := indent(l)
			if ind < dash {
				break
			}
			if ind == dash && !strings.HasPrefix(l[ind:], "-") || ind > dash && ind < dash+2 {
				return k
			}
		}
		return min(start, last)
	case strings.HasPrefix(msg, "did not find expected"):
		return min(reported+1, last)
	}
	return reported
}

// fields checks that n is a mapping whose keys are all in allowed, each once,
// and returns the value nodes by key. It returns nil if n is not a mapping.
func (d *decoder) fields(n *yaml.Node, path string, allowed []string) map[string]*yaml.Node {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.MappingNode {
		d.errf(n, path, "want a mapping, got %s", kindName(n))
		return nil
	}
	out := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !contains(allowed, k.Value) {
			if guess := closest(k.Value, allowed); guess != "" {
				d.errf(k, join(path, k.Value), "unknown field %q (did you mean %s?)", k.Value, guess)
			} else {
				d.errf(k, join(path, k.Value), "unknown field %q", k.Value)
			}
			continue
		}
		if _, dup := out[k.Value]; dup {
			d.errf(k, join(path, k.Value), "field %q given twice", k.Value)
			continue
		}
		if v.Kind == yaml.AliasNode {
			v = v.Alias
		}
		out[k.Value] = v
	}
	return out
}

// str reads the scalar at path.field as text; numbers are accepted as
// written, since values such as 500 or 10.0.0.1 are strings to the matcher.
// (The path is joined only for an error: 100,000 rules would otherwise make
// a million strings nobody reads.)
func (d *decoder) str(n *yaml.Node, path, field string) string {
	if n == nil || isNull(n) {
		return ""
	}
	if n.Kind != yaml.ScalarNode {
		d.errf(n, join(path, field), "want a string, got %s", kindName(n))
		return ""
	}
	return n.Value
}

func (d *decoder) boolean(n *yaml.Node, path, field string) bool {
	if n == nil || isNull(n) {
		return false
	}
	if b, ok := yaml11Bool(n); ok {
		return b
	}
	var b bool
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&b) != nil {
		d.errf(n, join(path, field), "want true or false, got %s", describe(n))
	}
	return b
}

// yaml11Bools are the plain words YAML 1.1 reads as booleans, as
// envoyproxy/ratelimit's YAML library (yaml.v2) reads them; YAML 1.2
// (yaml.v3, here) reads them as strings. A config written for the
// reference (shadow_mode: yes, detailed_metric: on) must mean the same
// here.
var yaml11Bools = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false, "off": false, "Off": false, "OFF": false,
}

// yaml11Bool reads n as YAML 1.1 would a boolean written as a word:
// plain (neither quoted nor tagged) and in yaml11Bools.
func yaml11Bool(n *yaml.Node) (b, ok bool) {
	if n.Kind != yaml.ScalarNode || n.Style != 0 || n.ShortTag() != "!!str" {
		return false, false
	}
	b, ok = yaml11Bools[n.Value]
	return b, ok
}

// yaml11Values rewrites the plain YAML 1.1 booleans among the values under
// n (not the keys) as YAML 1.2 booleans, so that decoding n gives what the
// reference's decoding gives (metadata: enabled: yes is true there).
func yaml11Values(n *yaml.Node) {
	switch n.Kind {
	case yaml.ScalarNode:
		if b, ok := yaml11Bool(n); ok {
			n.Tag, n.Value = "!!bool", strconv.FormatBool(b)
		}
	case yaml.MappingNode:
		for i := 1; i < len(n.Content); i += 2 {
			yaml11Values(n.Content[i])
		}
	case yaml.SequenceNode, yaml.DocumentNode:
		for _, c := range n.Content {
			yaml11Values(c)
		}
	}
}

func (d *decoder) uint(n *yaml.Node, path, field string, max uint64) uint64 {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		d.errf(n, join(path, field), "want a whole number, got %s", describe(n))
		return 0
	}
	v, err := strconv.ParseUint(n.Value, 0, 64)
	if err != nil || v > max {
		d.errf(n, join(path, field), "want a whole number from 0 to %d, got %s", max, n.Value)
		return 0
	}
	return v
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if isNull(n) {
			return "nothing"
		}
		return "a scalar " + strconv.Quote(n.Value)
	}
	return "an unexpected node"
}

func describe(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode && !isNull(n) {
		return strconv.Quote(n.Value)
	}
	return kindName(n)
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// decodeMetadata decodes a metadata node as yaml.v3's Decode into an any
// would, in time linear in its size: Decode checks a mapping's keys for
// duplicates pairwise, which took over a minute for 100,000 keys under one
// mapping. A mapping whose keys are all plain strings (no merge key) is
// built here, refusing a duplicate key as Decode does; anything else
// (scalars, mappings with other keys) is left to Decode.
func decodeMetadata(n *yaml.Node) (any, error) {
	switch n.Kind {
	case yaml.AliasNode:
		return decodeMetadata(n.Alias)
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := decodeMetadata(c)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case yaml.MappingNode:
		if !plainStringKeys(n) {
			break
		}
		out := make(map[string]any, len(n.Content)/2)
		lines := make(map[string]int, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if first, dup := lines[k.Value]; dup {
				return nil, fmt.Errorf("line %d: mapping key %q already defined at line %d", k.Line, k.Value, first)
			}
			lines[k.Value] = k.Line
			v, err := decodeMetadata(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			out[k.Value] = v
		}
		return out, nil
	}
	var v any
	err := n.Decode(&v)
	return v, err
}

// plainStringKeys reports whether every key of mapping n is a string
// scalar and none is a merge key (<<).
func plainStringKeys(n *yaml.Node) bool {
	for i := 0; i < len(n.Content); i += 2 {
		k := n.Content[i]
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			return false
		}
	}
	return true
}

// closest is the field of allowed that name was probably meant to be: the
// same but for case, '_' and '-' (ratelimit, rateLimit), or at most two
// edits away (desciptors); "" when none is.
func closest(name string, allowed []string) string {
	norm := func(s string) string { return strings.ToLower(strings.NewReplacer("_", "", "-", "").Replace(s)) }
	best, bestDist := "", 3
	for _, a := range allowed {
		if norm(a) == norm(name) {
			return a
		}
		if d := editDistance(name, a); d < bestDist && d < len(a) {
			best, bestDist = a, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, bytewise;
// names are short, and a field name longer than 64 bytes is no near miss.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 1 << 30
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
