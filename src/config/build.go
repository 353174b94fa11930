package config

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
)

// Options controls how files are combined.
type Options struct {
	// MergeDomains lets several files hold the same domain; their descriptor
	// lists are merged (MERGE_DOMAIN_CONFIG). A descriptor defined in two of
	// them is still an error.
	MergeDomains bool
	// HashValues writes every descriptor value hashed in counter keys
	// (CACHE_KEY_HASH_VALUES).
	HashValues bool
	// MaxDepth, when set, refuses descriptors nested deeper: no request can
	// reach them (REQUEST_MAX_ENTRIES bounds a descriptor's entries), and
	// each level's names grow with its depth.
	MaxDepth int
	// Wildcards decides which of several wildcard values that match a
	// request value applies (WILDCARD_PRECEDENCE): the first in the config
	// (the zero value, as envoyproxy/ratelimit), or the most literal.
	Wildcards WildcardPrecedence
	// RejectedHits is what a fixed_window limit does with a hit it rejects
	// when its descriptor does not say (REJECTED_HITS): the zero value
	// counts it, as envoyproxy/ratelimit does (see RejectedCount).
	RejectedHits RejectedHits
	// Skipped, when set, hears of each entry named like a config file
	// that LoadDir passes over because it is not a regular file (a FIFO,
	// socket or device would block or never end a read).
	Skipped func(path string, why error)
	// Noted, when set, hears of each file LoadFiles reads only in part
	// (File.Ignored), and of each domain whose lease: true the store
	// ignores (IgnoresLease): what a user may not expect, said once per
	// load.
	Noted func(path, note string)
	// IgnoresLease, when set, says why the store in use does not lease
	// (only Redis's does): Build notes each domain that asks for it.
	IgnoresLease string
}

// Config is a validated, immutable set of domains. It is safe for concurrent
// use; the zero value has no domains.
type Config struct {
	domains map[string]*Domain

	versionOnce sync.Once
	version     string
}

// Domain is one domain's descriptor tree.
type Domain struct {
	Name       string
	Files      []string
	root       level
	hashValues bool
	// countRejected is REJECTED_HITS for the domain: whether a request's
	// override counts rejected hits where its descriptor has no limit to
	// take that from.
	countRejected bool
}

// Node is one descriptor of the tree. Nodes are immutable.
type Node struct {
	key, value     string // value is "" for a key-only descriptor, the pattern for a wildcard
	path           string // metric path, e.g. "message_type_marketing.to_number"
	file           string
	line           int
	limits         []*Limit
	shadowMode     bool
	quotaMode      bool
	detailedMetric bool
	valueToMetric  bool
	shareThreshold bool
	metadata       map[string]any
	// failurePolicy is what to answer when the store fails: the nearest
	// failure_policy on this descriptor or an ancestor; empty means the
	// global BACKEND_FAILURE_POLICY.
	failurePolicy FailurePolicy
	// hashValue writes this level's request value hashed in counter keys.
	hashValue bool

	wildcard []string // the pattern split at '*'; nil when not a wildcard
	literal  int      // a wildcard's literal characters
	rank     int      // a wildcard's precedence before config order: literal, or 0 (see wildIndex.seal)
	seq      int      // a wildcard's place among its key's, in config order
	children level
	// valueInPath is set when this node or an ancestor has value_to_metric.
	valueInPath bool
}

// level is one list of descriptors, indexed for matching.
type level struct {
	exact   map[string]map[string]*Node // key → value → node
	wild    map[string]*wildIndex       // key → wildcard nodes
	keyOnly map[string]*Node
}

// Build merges parsed files into a Config. The error joins one *Error per
// problem. The config keeps the files' limits, and Build sets their
// MetricKey (the same on every build of a file).
func Build(files []*File, opts Options) (*Config, error) {
	c := &Config{domains: map[string]*Domain{}}
	var p packer
	first := map[string]*File{}
	var errs []error
	for _, f := range files {
		if f == nil {
			continue
		}
		d := c.domains[f.Domain]
		if d == nil {
			d = &Domain{Name: f.Domain, hashValues: opts.HashValues, countRejected: opts.RejectedHits != RejectedDrop}
			c.domains[f.Domain] = d
			first[f.Domain] = f
		} else if !opts.MergeDomains {
			errs = append(errs, &Error{File: f.Name, Line: f.Line, Path: "domain",
				Msg: fmt.Sprintf("duplicate domain %q (also in %s); set MERGE_DOMAIN_CONFIG=true to merge files of one domain", f.Domain, first[f.Domain].Name)})
			continue
		}
		if e := tooDeep(f.Name, f.Descriptors, 1, opts.MaxDepth); e != nil {
			errs = append(errs, e)
			continue
		}
		d.Files = append(d.Files, f.Name)
		setCountRejected(f.Descriptors, opts.RejectedHits)
		errs = append(errs, d.root.add(&p, f.Name, nil, f.Descriptors)...)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, d := range c.domains {
		d.root.seal(opts.Wildcards)
		leased := 0
		d.root.visit(func(n *Node) {
			for _, l := range n.limits {
				if l.Lease { // named in the lease's metrics
					l.Rule.Lease = p.str(d.Name + "." + l.MetricKey)
					leased++
				}
			}
		})
		if leased > 0 && opts.IgnoresLease != "" && opts.Noted != nil {
			opts.Noted(strings.Join(d.Files, ", "), fmt.Sprintf("domain %s: lease: true on %d limits is ignored: %s", d.Name, leased, opts.IgnoresLease))
		}
	}
	return c, nil
}

// setCountRejected sets Rule.CountRejected on every limit of ds and below
// by its descriptor's rejected_hits, or def where that is unset. A parsed
// file may be built again (a reload of other files): it gets the same.
func setCountRejected(ds []*Descriptor, def RejectedHits) {
	for _, d := range ds {
		for _, l := range d.Limits {
			l.Rule.CountRejected = countsRejected(l, d.RejectedHits, def)
		}
		setCountRejected(d.Descriptors, def)
	}
}

// tooDeep returns an error for the first descriptor nested deeper than max
// (0: no bound), before any of the file is built.
func tooDeep(file string, ds []*Descriptor, depth, max int) *Error {
	if max <= 0 {
		return nil
	}
	for _, d := range ds {
		if depth > max {
			return &Error{File: file, Line: d.Line, Path: d.Path, Msg: fmt.Sprintf(
				"nested %d levels deep, but requests carry at most %d entries per descriptor (REQUEST_MAX_ENTRIES): it could never match", depth, max)}
		}
		if e := tooDeep(file, d.Descriptors, depth+1, max); e != nil {
			return e
		}
	}
	return nil
}

// seal finishes the level and every level below it once all nodes are in.
func (lv *level) seal(prec WildcardPrecedence) {
	lv.sealWild(prec)
	lv.visit(func(n *Node) { n.children.sealWild(prec) })
}

func (lv *level) sealWild(prec WildcardPrecedence) {
	for _, w := range lv.wild {
		w.seal(prec)
	}
}

// WildcardPrecedence says which wildcard wins when several values of one
// key match a request value. An exact value always wins over wildcards,
// and wildcards over a key-only rule.
type WildcardPrecedence uint8

const (
	// WildcardFirst takes the first in the config, as envoyproxy/ratelimit.
	WildcardFirst WildcardPrecedence = iota
	// WildcardMostLiteral takes the one with the most literal (non-*)
	// characters, then the first in the config.
	WildcardMostLiteral
)

// ParseWildcardPrecedence reads WILDCARD_PRECEDENCE: "first" or
// "most_literal".
func ParseWildcardPrecedence(s string) (WildcardPrecedence, error) {
	switch s {
	case "first":
		return WildcardFirst, nil
	case "most_literal":
		return WildcardMostLiteral, nil
	}
	return 0, fmt.Errorf("want first or most_literal, got %q", s)
}

func (lv *level) add(p *packer, file string, parent *Node, descs []*Descriptor) []error {
	var errs []error
	for _, desc := range descs {
		if prev := lv.lookup(desc.Key, desc.Value); prev != nil {
			errs = append(errs, &Error{File: file, Line: desc.Line, Path: desc.Path,
				Msg: fmt.Sprintf("duplicate descriptor key=%q value=%q (also at %s:%d)", desc.Key, desc.Value, prev.file, prev.line)})
			continue
		}
		n := p.node()
		*n = Node{
			key: p.key(desc.Key), value: p.str(desc.Value), file: file, line: desc.Line, limits: desc.Limits,
			shadowMode: desc.ShadowMode, quotaMode: desc.QuotaMode, detailedMetric: desc.DetailedMetric,
			valueToMetric: desc.ValueToMetric, shareThreshold: desc.ShareThreshold, metadata: desc.Metadata,
			failurePolicy: desc.FailurePolicy, hashValue: desc.HashValue,
		}
		path := desc.Key
		if desc.Value != "" {
			path += "_" + desc.Value
		}
		n.valueInPath = desc.ValueToMetric
		if parent != nil {
			path = parent.path + "." + path
			n.valueInPath = n.valueInPath || parent.valueInPath
			if n.failurePolicy == "" {
				n.failurePolicy = parent.failurePolicy
			}
		}
		n.path = p.str(path)
		for _, l := range n.limits {
			l.identity = p.key(l.identity) // not the parsed file's copy, which would keep its text
			l.MetricKey = n.path
			if len(n.limits) > 1 {
				l.MetricKey = p.str(n.path + "." + l.identity)
			}
		}
		if strings.Contains(n.value, "*") {
			n.wildcard = p.split(n.value)
		}
		lv.insert(n)
		errs = append(errs, n.children.add(p, file, n, desc.Descriptors)...)
	}
	return errs
}

func (lv *level) lookup(key, value string) *Node {
	if value == "" {
		return lv.keyOnly[key]
	}
	if n := lv.exact[key][value]; n != nil {
		return n
	}
	if w := lv.wild[key]; w != nil {
		return w.byValue[value]
	}
	return nil
}

func (lv *level) insert(n *Node) {
	switch {
	case n.value == "":
		if lv.keyOnly == nil {
			lv.keyOnly = map[string]*Node{}
		}
		lv.keyOnly[n.key] = n
	case n.wildcard != nil:
		if lv.wild == nil {
			lv.wild = map[string]*wildIndex{}
		}
		if lv.wild[n.key] == nil {
			lv.wild[n.key] = &wildIndex{}
		}
		lv.wild[n.key].add(n)
	default:
		if lv.exact == nil {
			lv.exact = map[string]map[string]*Node{}
		}
		if lv.exact[n.key] == nil {
			lv.exact[n.key] = map[string]*Node{}
		}
		lv.exact[n.key][n.value] = n
	}
}

// Domain returns the named domain, or nil.
func (c *Config) Domain(name string) *Domain {
	if c == nil {
		return nil
	}
	return c.domains[name]
}

// Domains returns the domain names, sorted.
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	names := make([]string, 0, len(c.domains))
	for n := range c.domains {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// visit calls fn for every node of the domain, parents before children,
// each level in file order.
func (d *Domain) visit(fn func(*Node)) {
	if d != nil {
		d.root.visit(fn)
	}
}

// visit calls fn for every node of the level and below, parents first.
func (lv *level) visit(fn func(*Node)) {
	for _, n := range lv.nodes() {
		fn(n)
		n.children.visit(fn)
	}
}
