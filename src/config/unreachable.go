package config

import (
	"fmt"
	"strings"
)

// RequestBounds are the bounds the service puts on a request
// (REQUEST_MAX_STRING_BYTES, REQUEST_MAX_ENTRIES, REQUEST_MAX_BYTES). A rule
// outside them can never match.
type RequestBounds struct {
	MaxStringBytes  int // a domain or key
	MaxEntries      int // entries per descriptor, so the deepest rule
	MaxRequestBytes int // a whole request, so any one value
}

// DefaultRequestBounds are the service's defaults of those settings (a
// test keeps them equal to the settings' and the service's).
var DefaultRequestBounds = RequestBounds{MaxStringBytes: 4096, MaxEntries: 32, MaxRequestBytes: 256 << 10}

// Unreachable returns a warning for each rule no request within b can
// reach: a domain or key longer than a request may carry, a value whose
// literal part is longer than a whole request, or a descriptor deeper than
// a request's entries. Each names the file, line and path. Rules below an
// unreachable one are not repeated.
func Unreachable(files []*File, b RequestBounds) []*Error {
	var out []*Error
	for _, f := range files {
		if b.MaxStringBytes > 0 && len(f.Domain) > b.MaxStringBytes {
			out = append(out, &Error{File: f.Name, Line: f.Line, Path: "domain", Msg: fmt.Sprintf(
				"never matches: the domain is %d bytes and requests carry at most %d (REQUEST_MAX_STRING_BYTES)", len(f.Domain), b.MaxStringBytes)})
			continue
		}
		out = unreachable(out, f.Name, f.Descriptors, 1, b)
	}
	return out
}

func unreachable(out []*Error, file string, ds []*Descriptor, depth int, b RequestBounds) []*Error {
	for _, d := range ds {
		var why string
		switch literal := len(d.Value) - strings.Count(d.Value, "*"); {
		case b.MaxEntries > 0 && depth > b.MaxEntries:
			why = fmt.Sprintf("it is %d levels deep and requests carry at most %d entries per descriptor (REQUEST_MAX_ENTRIES)", depth, b.MaxEntries)
		case b.MaxStringBytes > 0 && len(d.Key) > b.MaxStringBytes:
			why = fmt.Sprintf("the key is %d bytes and requests carry at most %d (REQUEST_MAX_STRING_BYTES)", len(d.Key), b.MaxStringBytes)
		case b.MaxRequestBytes > 0 && literal > b.MaxRequestBytes:
			why = fmt.Sprintf("the value is %d bytes and a whole request is at most %d (REQUEST_MAX_BYTES)", literal, b.MaxRequestBytes)
		}
		if why != "" {
			out = append(out, &Error{File: file, Line: d.Line, Path: d.Path, Msg: "never matches: " + why})
			continue
		}
		out = unreachable(out, file, d.Descriptors, depth+1, b)
	}
	return out
}

// UnknownReplaces returns a warning for each `replaces` that names no
// limit of its domain (across files, as MERGE_DOMAIN_CONFIG merges them):
// it replaces nothing, which is nearly always a typo. Each names the file,
// the line of the replaces entry and the path.
func UnknownReplaces(files []*File) []*Error {
	names := map[string]map[string]bool{} // domain → limit names
	var walk func(domain string, ds []*Descriptor, visit func(d *Descriptor, l *Limit))
	walk = func(domain string, ds []*Descriptor, visit func(d *Descriptor, l *Limit)) {
		for _, d := range ds {
			for _, l := range d.Limits {
				visit(d, l)
			}
			walk(domain, d.Descriptors, visit)
		}
	}
	for _, f := range files {
		if names[f.Domain] == nil {
			names[f.Domain] = map[string]bool{}
		}
		walk(f.Domain, f.Descriptors, func(_ *Descriptor, l *Limit) {
			if l.Name != "" {
				names[f.Domain][l.Name] = true
			}
		})
	}
	var out []*Error
	for _, f := range files {
		walk(f.Domain, f.Descriptors, func(d *Descriptor, l *Limit) {
			for i, r := range l.Replaces {
				if !names[f.Domain][r] {
					line := l.Line
					if i < len(l.ReplacesLines) {
						line = l.ReplacesLines[i] // the entry that names it
					}
					out = append(out, &Error{File: f.Name, Line: line, Path: d.Path, Msg: fmt.Sprintf(
						"replaces %q, but no limit of domain %q is named so: it replaces nothing", r, f.Domain)})
				}
			}
		})
	}
	return out
}
