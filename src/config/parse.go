package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/openrls/ratelimit/src/escape"
	"github.com/openrls/ratelimit/src/limiter"
)

// File is one parsed config file: one domain and its descriptor tree.
type File struct {
	Name        string
	Domain      string
	Line        int // of the domain key
	Descriptors []*Descriptor
	// Ignored, when not empty, says what of the file was not read: the
	// YAML documents after the first, as envoyproxy/ratelimit reads a
	// file.
	Ignored string
}

// Descriptor is one entry of a descriptor list, as written.
type Descriptor struct {
	Key, Value     string
	Line           int
	Path           string // e.g. descriptors[0].descriptors[1]
	Limits         []*Limit
	ShadowMode     bool
	QuotaMode      bool
	DetailedMetric bool
	ValueToMetric  bool
	ShareThreshold bool
	// FailurePolicy is error, allow, deny or local; empty inherits.
	FailurePolicy FailurePolicy
	// HashValue hashes this level's request value in counter keys.
	HashValue bool
	// Overdraft counts hits past this descriptor's limits (not inherited).
	Overdraft bool
	// RejectedHits is what this descriptor's fixed windows do with a hit
	// they reject; unset takes Options.RejectedHits (not inherited).
	RejectedHits RejectedHits
	Metadata     map[string]any
	Descriptors  []*Descriptor
}

var (
	descriptorFields = []string{"key", "value", "rate_limit", "rate_limits", "descriptors", "shadow_mode",
		"quota_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata", "failure_policy", "hash_value",
		"overdraft", "rejected_hits"}
	limitFields = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm",
		"unit_multiplier", "burst", "lease", "calendar"}
)

// Parse reads one config file. The error, if any, joins one *Error per
// problem found, so a single run shows them all. A large file is decoded in
// pieces (chunks.go) when its shape allows.
func Parse(name string, data []byte) (*File, error) {
	if f, taken, err := parseInChunks(name, data, chunkMin, chunkItems); taken {
		return f, err
	}
	return parseWhole(name, data)
}

// parseWhole decodes data as one document.
func parseWhole(name string, data []byte) (*File, error) {
	d := &decoder{file: name}
	f := &File{Name: name}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &Error{File: name, Msg: "file is empty: want a mapping with domain and descriptors"}
		}
		return nil, d.yamlError(err, data)
	}
	if err := checkAliases(name, &doc); err != nil {
		return nil, err
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	fields := d.fields(root, "", []string{"domain", "descriptors"})
	if fields == nil {
		return nil, d.err()
	}
	if n := fields["domain"]; n == nil {
		d.errf(root, "", "missing domain")
	} else {
		f.Domain, f.Line = escape.String(d.str(n, "", "domain")), n.Line
		if f.Domain == "" {
			d.errf(n, "domain", "domain is empty")
		}
	}
	f.Descriptors = d.descriptors(fields["descriptors"], "descriptors")
	// Documents after the first are not read, as envoyproxy/ratelimit
	// (yaml.Unmarshal) does not read them: said, so that a user who meant
	// them as more domains finds out. Text after the first that does not
	// parse is still an error: the file is not what it seems.
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == nil:
		f.Ignored = fmt.Sprintf("the YAML documents from line %d on are not read (only a file's first document is, as envoyproxy/ratelimit reads it): put each domain in a file of its own", extra.Line)
	case !errors.Is(err, io.EOF):
		d.errs = append(d.errs, d.yamlError(err, data))
	}
	return f, d.err()
}

// MaxDepth is the deepest descriptor nesting a file may hold, whatever the
// settings: REQUEST_MAX_ENTRIES may not exceed it. It keeps parsing linear:
// names and paths built per level would otherwise grow with the square of
// the depth.
const MaxDepth = 1024

func (d *decoder) descriptors(n *yaml.Node, path string) []*Descriptor {
	if n == nil || isNull(n) {
		return nil
	}
	if d.depth >= MaxDepth {
		d.errf(n, path, "descriptors nested more than %d levels deep", MaxDepth)
		return nil
	}
	d.depth++
	defer func() { d.depth-- }()
	if n.Kind != yaml.SequenceNode {
		d.errf(n, path, "want a list of descriptors, got %s", kindName(n))
		return nil
	}
	out := make([]*Descriptor, 0, len(n.Content))
	seen := map[[2]string]int{}
	for i, c := range n.Content {
		if desc := d.descriptor(c, fmt.Sprintf("%s[%d]", path, i)); desc != nil && d.unique(seen, desc) {
			out = append(out, desc)
		}
	}
	return out
}

// unique reports whether desc is the first of its key and value in seen
// (by line), and records it; a second one is an error.
func (d *decoder) unique(seen map[[2]string]int, desc *Descriptor) bool {
	id := [2]string{desc.Key, desc.Value}
	if first, dup := seen[id]; dup {
		d.errAt(desc.Line, desc.Path, "duplicate descriptor key=%q value=%q (first at line %d)", desc.Key, desc.Value, first)
		return false
	}
	seen[id] = desc.Line
	return true
}

func (d *decoder) descriptor(n *yaml.Node, path string) *Descriptor {
	f := d.fields(n, path, descriptorFields)
	if f == nil {
		return nil
	}
	desc := d.pack.descriptor()
	*desc = Descriptor{Line: n.Line, Path: d.pack.str(path)}
	if f["key"] == nil {
		d.errf(n, path, "missing key")
	} else if desc.Key = d.pack.key(escape.String(d.str(f["key"], path, "key"))); desc.Key == "" {
		d.errf(f["key"], path+".key", "key is empty")
	}
	// Escaped as request strings are (package escape), so that a value with
	// a backslash matches the request that carries it.
	desc.Value = d.pack.str(escape.String(d.str(f["value"], path, "value")))
	desc.ShadowMode = d.boolean(f["shadow_mode"], path, "shadow_mode")
	desc.QuotaMode = d.boolean(f["quota_mode"], path, "quota_mode")
	desc.DetailedMetric = d.boolean(f["detailed_metric"], path, "detailed_metric")
	desc.ValueToMetric = d.boolean(f["value_to_metric"], path, "value_to_metric")
	desc.ShareThreshold = d.boolean(f["share_threshold"], path, "share_threshold")
	desc.HashValue = d.boolean(f["hash_value"], path, "hash_value")
	if desc.ShareThreshold && !strings.Contains(desc.Value, "*") {
		d.errf(f["share_threshold"], path+".share_threshold", "share_threshold needs a wildcard value (one with *)")
	}
	if n := f["failure_policy"]; n != nil {
		desc.FailurePolicy = FailurePolicy(d.str(n, path, "failure_policy"))
		if !desc.FailurePolicy.Valid() {
			d.errf(n, path+".failure_policy", "unknown failure policy %q (want error, allow, deny or local)", desc.FailurePolicy)
		}
	}
	if m := f["metadata"]; m != nil && !isNull(m) {
		if m.Kind != yaml.MappingNode {
			d.errf(m, path+".metadata", "want a mapping, got %s", kindName(m))
		} else {
			yaml11Values(m)
			md, err := decodeMetadata(m)
			if err != nil {
				d.errf(m, path+".metadata", "%v", err)
			}
			desc.Metadata, _ = md.(map[string]any)
		}
	}
	d.limits(f, desc, path)
	if n := f["overdraft"]; n != nil {
		desc.Overdraft = d.boolean(n, path, "overdraft")
		d.applyOverdraft(desc, n, path)
	}
	d.rejectedHits(desc, f["rejected_hits"], path)
	desc.Limits = d.pack.limitList(desc.Limits)
	d.checkLimitSet(desc)
	desc.Descriptors = d.descriptors(f["descriptors"], path+".descriptors")
	return desc
}

// limits decodes a descriptor's rate_limit and rate_limits into
// desc.Limits, in that order.
func (d *decoder) limits(f map[string]*yaml.Node, desc *Descriptor, path string) {
	if rl := f["rate_limit"]; rl != nil && !isNull(rl) {
		if l := d.limit(rl, path+".rate_limit"); l != nil {
			desc.Limits = append(desc.Limits, l)
		}
	}
	if rls := f["rate_limits"]; rls != nil && !isNull(rls) {
		if rls.Kind != yaml.SequenceNode {
			d.errf(rls, path+".rate_limits", "want a list of rate limits, got %s", kindName(rls))
		} else {
			for i, c := range rls.Content {
				if l := d.limit(c, fmt.Sprintf("%s.rate_limits[%d]", path, i)); l != nil {
					desc.Limits = append(desc.Limits, l)
				}
			}
		}
	}
}

// applyOverdraft marks each of desc's counted limits as overdraft; it is an
// error on a descriptor without one, where it would do nothing.
func (d *decoder) applyOverdraft(desc *Descriptor, n *yaml.Node, path string) {
	if !desc.Overdraft {
		return
	}
	counted := false
	for _, l := range desc.Limits {
		if l.Algorithm == limiter.Concurrency {
			d.errf(n, path+".overdraft", "overdraft cannot be combined with algorithm: concurrency (the limit at line %d): "+
				"a request that finds every slot taken takes none", l.Line)
		}
		if l.Lease {
			d.errf(n, path+".overdraft", "overdraft cannot be combined with lease (the limit at line %d): overdraft counts usage after the fact, "+
				"past what a slice another replica holds can see", l.Line)
		}
		if !l.Unlimited {
			l.Rule.Overdraft, counted = true, true
		}
	}
	if !counted {
		d.errf(n, path+".overdraft", "overdraft applies to this descriptor's own limits, and it has none (it is not inherited)")
	}
}

// checkLimitSet validates what only shows across the limits of one
// descriptor.
func (d *decoder) checkLimitSet(desc *Descriptor) {
	seen := map[string]int{}
	for _, l := range desc.Limits {
		if l.Unlimited && len(desc.Limits) > 1 {
			d.errAt(l.Line, desc.Path, "unlimited cannot be combined with other limits on one descriptor")
		}
		if l.Unlimited {
			continue
		}
		if first, dup := seen[l.identity]; dup {
			d.errAt(l.Line, desc.Path, "two limits with the same algorithm and period (%s per %s) on one descriptor (first at line %d)",
				l.Algorithm, periodString(l.Unit, l.UnitMultiplier), first)
		}
		seen[l.identity] = l.Line
	}
}

func (d *decoder) limit(n *yaml.Node, path string) *Limit {
	f := d.fields(n, path, limitFields)
	if f == nil {
		return nil
	}
	l := d.pack.limit()
	*l = Limit{Line: n.Line, UnitMultiplier: 1}
	l.Name = d.str(f["name"], path, "name")
	l.Unlimited = d.boolean(f["unlimited"], path, "unlimited")
	l.Replaces, l.ReplacesLines = d.replaces(f["replaces"], path+".replaces")
	for _, r := range l.Replaces {
		if r != "" && r == l.Name {
			d.errf(f["replaces"], path+".replaces", "a limit cannot replace itself (%q)", r)
		}
	}
	if l.Unlimited {
		for _, k := range []string{"unit", "requests_per_unit", "algorithm", "unit_multiplier", "burst", "lease", "calendar"} {
			if f[k] != nil {
				d.errf(f[k], path+"."+k, "unlimited: true cannot have %s", k)
			}
		}
		return l
	}
	d.rate(f, l, path)
	d.calendar(f, l, path)
	if l.Unit != 0 {
		if err := l.finish(); err != nil {
			d.errAt(l.Line, path, "%v", err)
		}
		l.identity = d.pack.key(l.identity) // a few distinct ones, on every limit
	}
	return l
}

// rate decodes a limited limit's rate fields (unit, requests_per_unit,
// unit_multiplier, algorithm, burst, lease) into l.
func (d *decoder) rate(f map[string]*yaml.Node, l *Limit, path string) {
	if n := f["unit"]; n == nil {
		d.errAt(l.Line, path, "missing unit")
	} else if u, err := parseUnit(d.str(n, path, "unit")); err != nil {
		d.errf(n, path+".unit", "%v", err)
	} else {
		l.Unit = u
	}
	if n := f["requests_per_unit"]; n == nil {
		d.errAt(l.Line, path, "missing requests_per_unit (use 0 to reject everything, or unlimited: true)")
	} else {
		l.RequestsPerUnit = uint32(d.uint(n, path, "requests_per_unit", limiter.MaxLimit))
	}
	if n := f["unit_multiplier"]; n != nil {
		l.UnitMultiplier = uint32(d.uint(n, path, "unit_multiplier", math.MaxUint32))
		if l.UnitMultiplier == 0 {
			d.errf(n, path+".unit_multiplier", "unit_multiplier must be at least 1")
			l.UnitMultiplier = 1
		}
	}
	if n := f["algorithm"]; n != nil {
		a, err := limiter.ParseAlgorithm(d.str(n, path, "algorithm"))
		if err != nil {
			d.errf(n, path+".algorithm", "%v", err)
		}
		l.Algorithm = a
	}
	if n := f["burst"]; n != nil {
		l.Burst = uint32(d.uint(n, path, "burst", limiter.MaxLimit))
		if l.Algorithm != limiter.TokenBucket {
			d.errf(n, path+".burst", "burst applies only to algorithm: token_bucket")
		} else if l.Burst == 0 {
			d.errf(n, path+".burst", "burst must be at least 1")
		}
	}
	if n := f["lease"]; n != nil {
		l.Lease = d.boolean(n, path, "lease")
		if l.Lease && !limiter.LeaseSupported(l.Algorithm) {
			d.errf(n, path+".lease", "lease holds the limit exactly only for fixed_window and sliding_window, not %s: "+
				"a slice's hits are counted when it is taken and spent later, under which a token bucket refills and a sliding log loses their times", l.Algorithm)
		}
	}
}

// replaces reads a limit's replaces list: the names, and the line of each.
func (d *decoder) replaces(n *yaml.Node, path string) (names []string, lines []int) {
	if n == nil || isNull(n) {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		d.errf(n, path, "want a list of {name: ...}, got %s", kindName(n))
		return nil, nil
	}
	for i, c := range n.Content {
		p := fmt.Sprintf("%s[%d]", path, i)
		f := d.fields(c, p, []string{"name"})
		if f == nil {
			continue
		}
		name := d.str(f["name"], p, "name")
		if name == "" {
			d.errf(c, p+".name", "replaces needs a non-empty name")
			continue
		}
		names, lines = append(names, name), append(lines, f["name"].Line)
	}
	return names, lines
}
