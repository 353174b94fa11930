package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/openrls/ratelimit/src/config/configtest"
)

func TestParseBadFiles(t *testing.T) {
	tests := []struct {
		file string
		want []string // each must appear in the error, in order
	}{
		{"unknown_unit.yaml", []string{`unknown_unit.yaml:5: descriptors[0].rate_limit.unit: unknown unit "minutes"`}},
		{"missing_unit.yaml", []string{`missing_unit.yaml:5: descriptors[0].rate_limit: missing unit`}},
		{"missing_rpu.yaml", []string{`missing_rpu.yaml:5: descriptors[0].rate_limit: missing requests_per_unit`}},
		{"unknown_field.yaml", []string{`unknown_field.yaml:7: descriptors[0].rate_limit.colour: unknown field "colour"`}},
		{"duplicate_descriptor.yaml", []string{`duplicate_descriptor.yaml:6: descriptors[2]: duplicate descriptor key="a" value="x" (first at line 3)`}},
		{"unlimited_with_unit.yaml", []string{`unlimited_with_unit.yaml:6: descriptors[0].rate_limit.unit: unlimited: true cannot have unit`}},
		{"empty_replaces_name.yaml", []string{`empty_replaces_name.yaml:8: descriptors[0].rate_limit.replaces[0].name: replaces needs a non-empty name`}},
		{"share_threshold_no_wildcard.yaml", []string{`share_threshold_no_wildcard.yaml:5: descriptors[0].share_threshold: share_threshold needs a wildcard value`}},
		{"missing_domain.yaml", []string{`missing_domain.yaml:1: missing domain`}},
		{"missing_key.yaml", []string{`missing_key.yaml:3: descriptors[0]: missing key`}},
		{"unknown_algorithm.yaml", []string{`unknown_algorithm.yaml:7: descriptors[0].rate_limit.algorithm: unknown algorithm "leaky"`}},
		{"burst_without_token_bucket.yaml", []string{`burst_without_token_bucket.yaml:7: descriptors[0].rate_limit.burst: burst applies only to algorithm: token_bucket`}},
		{"negative_rpu.yaml", []string{`negative_rpu.yaml:6: descriptors[0].rate_limit.requests_per_unit: want a whole number from 0 to 4294967295, got -1`}},
		{"zero_multiplier.yaml", []string{`zero_multiplier.yaml:7: descriptors[0].rate_limit.unit_multiplier: unit_multiplier must be at least 1`}},
		{"duplicate_limit_identity.yaml", []string{`duplicate_limit_identity.yaml:7: descriptors[0]: two limits with the same algorithm and period (fixed_window per second) on one descriptor (first at line 5)`}},
		{"bad_bool.yaml", []string{`bad_bool.yaml:4: descriptors[0].shadow_mode: want true or false, got "yes please"`}},
		{"bad_yaml.yaml", []string{`bad_yaml.yaml:7: invalid YAML: did not find expected '-' indicator`}},
		{"empty.yaml", []string{`empty.yaml: file is empty`}},
		{"token_bucket_too_fast.yaml", []string{`token_bucket_too_fast.yaml:5: descriptors[0].rate_limit: token_bucket refills at most one token per microsecond`}},
		{"window_too_long.yaml", []string{`window_too_long.yaml:5: descriptors[0].rate_limit: a window of 11 years is longer than the longest supported`}},
		{"descriptors_not_list.yaml", []string{`descriptors_not_list.yaml:2: descriptors: want a list of descriptors, got a mapping`}},
		{"replaces_itself.yaml", []string{`replaces_itself.yaml:9: descriptors[0].rate_limit.replaces: a limit cannot replace itself ("self")`}},
		{"unknown_failure_policy.yaml", []string{`unknown_failure_policy.yaml:4: descriptors[0].failure_policy: unknown failure policy "sometimes"`}},
		{"alias_bomb.yaml", []string{`alias_bomb.yaml:7: aliases expand this file past 10000 nodes (64 times the 116 written, at least 10000) at alias *d`}},
		{"alias_cycle.yaml", []string{`alias_cycle.yaml:5: alias *all refers to a node that contains it (anchored at line 2)`}},
		{"overdraft_without_limit.yaml", []string{`overdraft_without_limit.yaml:4: descriptors[0].overdraft: overdraft applies to this descriptor's own limits, and it has none (it is not inherited)`}},
		{"sliding_log_too_large.yaml", []string{`sliding_log_too_large.yaml:5: descriptors[0].rate_limit: sliding_log keeps every counted request, so it allows at most 1000 requests per window, not 20000`}},
		{"concurrency_too_many_slots.yaml", []string{`concurrency_too_many_slots.yaml:5: descriptors[0].rate_limit: concurrency keeps every held slot, so it allows at most 1000 slots, not 5000`}},
		{"concurrency_overdraft.yaml", []string{`concurrency_overdraft.yaml:4: descriptors[0].overdraft: overdraft cannot be combined with algorithm: concurrency (the limit at line 6)`}},
		{"calendar_unknown_zone.yaml", []string{`calendar_unknown_zone.yaml:7: descriptors[0].rate_limit.calendar: unknown time zone "Mars/Olympus_Mons" (want UTC or an IANA name such as America/New_York)`}},
		{"calendar_minute.yaml", []string{`calendar_minute.yaml:7: descriptors[0].rate_limit.calendar: calendar aligns day, week, month and year windows, not a minute`}},
		{"calendar_local.yaml", []string{`calendar_local.yaml:4: descriptors[0].rate_limit.calendar: calendar needs a zone every replica reads alike: UTC or an IANA name such as America/New_York, not "Local"`}},
		{"calendar_token_bucket.yaml", []string{`calendar_token_bucket.yaml:4: descriptors[0].rate_limit.calendar: calendar applies to the windows of fixed_window and sliding_window, and token_bucket has none`}},
		{"calendar_multiplier.yaml", []string{`calendar_multiplier.yaml:4: descriptors[0].rate_limit.calendar: calendar windows are one month each: unit_multiplier 3 cannot be aligned to the calendar`}},
		{"calendar_lease.yaml", []string{`calendar_lease.yaml:4: descriptors[0].rate_limit.calendar: calendar cannot be combined with lease`}},
		{"lease_token_bucket.yaml", []string{`lease_token_bucket.yaml:8: descriptors[0].rate_limit.lease: lease holds the limit exactly only for fixed_window and sliding_window, not token_bucket`}},
		{"lease_overdraft.yaml", []string{`lease_overdraft.yaml:4: descriptors[0].overdraft: overdraft cannot be combined with lease (the limit at line 6)`}},
		{"rejected_hits_sliding.yaml", []string{`rejected_hits_sliding.yaml:4: descriptors[0].rejected_hits: rejected_hits: count applies to fixed_window limits only, and the limit at line 6 is sliding_window`}},
		{"rejected_hits_overdraft.yaml", []string{`rejected_hits_overdraft.yaml:5: descriptors[0].rejected_hits: rejected_hits: count cannot be combined with overdraft`}},
		{"rejected_hits_lease.yaml", []string{`rejected_hits_lease.yaml:4: descriptors[0].rejected_hits: rejected_hits: count cannot be combined with lease (the limit at line 6)`}},
		{"rejected_hits_unknown.yaml", []string{`rejected_hits_unknown.yaml:4: descriptors[0].rejected_hits: want count or drop, got "keep"`}},
		{"lease_unlimited.yaml", []string{`lease_unlimited.yaml:6: descriptors[0].rate_limit.lease: unlimited: true cannot have lease`}},
		{"two_problems.yaml", []string{
			`two_problems.yaml:5: descriptors[0].rate_limit.unit: unlimited: true cannot have unit`,
			`two_problems.yaml:6: descriptors[0].rate_limit.requests_per_unit: unlimited: true cannot have requests_per_unit`,
		}},
	}
	entries, err := os.ReadDir("testdata/bad")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(tests) {
		t.Errorf("testdata/bad has %d files but the table has %d cases: every fixture needs a case", len(entries), len(tests))
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			name := filepath.Join("testdata/bad", tc.file)
			data, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			f, err := Parse(name, data)
			if err == nil {
				_, err = Build([]*File{f}, Options{})
			}
			if err == nil {
				t.Fatalf("Parse(%s) = nil error, want %q", tc.file, tc.want)
			}
			got := err.Error()
			rest := got
			for _, w := range tc.want {
				w = "testdata/bad/" + w
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("Parse(%s) error =\n%s\nwant it to contain (in order)\n%s", tc.file, got, w)
				}
				rest = rest[i+len(w):]
			}
		})
	}
}

func TestBuildDuplicateDomain(t *testing.T) {
	a := mustParse(t, "a.yaml", "domain: d\ndescriptors:\n  - key: x\n")
	b := mustParse(t, "b.yaml", "domain: d\ndescriptors:\n  - key: y\n  - key: x\n")
	_, err := Build([]*File{a, b}, Options{})
	if err == nil || !strings.Contains(err.Error(), `b.yaml:1: domain: duplicate domain "d" (also in a.yaml)`) {
		t.Errorf("Build(same domain twice) error = %v, want a duplicate domain error naming both files", err)
	}
	_, err = Build([]*File{a, b}, Options{MergeDomains: true})
	if err == nil || !strings.Contains(err.Error(), `b.yaml:4: descriptors[1]: duplicate descriptor key="x" value="" (also at a.yaml:3)`) {
		t.Errorf("Build(merge, overlapping descriptor) error = %v, want a duplicate descriptor error", err)
	}
	c := mustParse(t, "c.yaml", "domain: d\ndescriptors:\n  - key: y\n")
	cfg, err := Build([]*File{a, c}, Options{MergeDomains: true})
	if err != nil {
		t.Fatalf("Build(merge) error = %v", err)
	}
	if got := cfg.Domain("d").Files; len(got) != 2 {
		t.Errorf("merged domain files = %v, want both", got)
	}
}

func mustParse(t testing.TB, name, src string) *File {
	t.Helper()
	f, err := Parse(name, []byte(src))
	if err != nil {
		t.Fatalf("Parse(%s): %v", name, err)
	}
	return f
}

func mustBuild(t testing.TB, src string) *Config {
	t.Helper()
	c, err := Build([]*File{mustParse(t, "test.yaml", src)}, Options{})
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return c
}

// TestAliasesWithinBudget: aliases used as people use them (one limit
// block shared by many descriptors, a subtree reused per tenant) parse, and
// expand to what they name.
func TestAliasesWithinBudget(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: shared\ndescriptors:\n")
	b.WriteString("  - key: tenant\n    value: t0\n    descriptors: &plan\n")
	for i := range 20 {
		fmt.Fprintf(&b, "      - key: route%d\n        rate_limit: &l%d {unit: minute, requests_per_unit: %d}\n", i, i, i+1)
	}
	for i := 1; i < 300; i++ {
		fmt.Fprintf(&b, "  - key: tenant\n    value: t%d\n    rate_limit: *l%d\n    descriptors: *plan\n", i, i%20)
	}
	f, err := Parse("shared.yaml", []byte(b.String()))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(f.Descriptors) != 300 || len(f.Descriptors[299].Descriptors) != 20 || f.Descriptors[299].Limits[0].RequestsPerUnit != 20 {
		t.Errorf("aliases did not expand to what they name: %d tenants, the last with %d routes", len(f.Descriptors), len(f.Descriptors[299].Descriptors))
	}
}

// TestAliasExpansionIsBounded: whatever the shape, what Parse builds stays
// within the budget: a bomb that doubles at every level is refused at the
// level that crosses it, deep or wide.
func TestAliasExpansionIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name        string
		levels, fan int
	}{
		{"deep, fan 2", 40, 2}, {"shallow, fan 100", 3, 100}, {"fan 10", 7, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			b.WriteString("domain: d\ndescriptors:\n- &l0 {key: k0}\n")
			for i := 1; i <= tc.levels; i++ {
				refs := strings.Repeat(fmt.Sprintf("*l%d,", i-1), tc.fan)
				fmt.Fprintf(&b, "- &l%d {key: k%d, descriptors: [%s]}\n", i, i, strings.TrimSuffix(refs, ","))
			}
			_, err := Parse("bomb.yaml", []byte(b.String()))
			if err == nil || !strings.Contains(err.Error(), "aliases expand this file past") {
				t.Errorf("Parse(%d levels of %d aliases) = %v, want the expansion refused", tc.levels, tc.fan, err)
			}
		})
	}
}

func TestOverdraftAppliesToEachLimit(t *testing.T) {
	f := mustParse(t, "od.yaml", `domain: d
descriptors:
  - key: tenant
    overdraft: true
    rate_limits:
      - {unit: minute, requests_per_unit: 100}
      - {unit: hour, requests_per_unit: 1000, algorithm: token_bucket}
    descriptors:
      - key: model
        rate_limit: {unit: minute, requests_per_unit: 10}
`)
	c, err := Build([]*File{f}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := `d.tenant: 100 per minute, fixed_window, overdraft, metrics as d.tenant.fw60 (od.yaml:6)
d.tenant: 1000 per hour, token_bucket, overdraft, metrics as d.tenant.tb3600 (od.yaml:7)
d.tenant.model: 10 per minute, fixed_window (od.yaml:10)
`
	if got := c.Dump(); got != want {
		t.Errorf("Dump() =\n%s\nwant\n%s", got, want)
	}
	for _, l := range f.Descriptors[0].Limits {
		if !l.Rule.Overdraft {
			t.Errorf("limit at line %d: Rule.Overdraft not set", l.Line)
		}
	}
	// A per-request override keeps the matched descriptor's overdraft, as it
	// keeps its algorithm.
	override := configtest.Desc("tenant=a")
	override.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_HOUR}
	p, err := c.Plan("d", []*rlv3.RateLimitDescriptor{override, configtest.Desc("tenant=a", "model=m")}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	if len(p.Hits) != 2 || !p.Hits[0].Rule.Overdraft || p.Hits[0].Rule.Limit != 5 || p.Hits[1].Rule.Overdraft {
		t.Errorf("Plan hits = %+v, want the override with overdraft and the child without", p.Hits)
	}
}

func TestLeaseNamesItsRule(t *testing.T) {
	f := mustParse(t, "lease.yaml", `domain: d
descriptors:
  - key: api
    rate_limits:
      - {unit: second, requests_per_unit: 50000, lease: true}
      - {unit: minute, requests_per_unit: 2000000, algorithm: sliding_window, lease: true}
      - {unit: hour, requests_per_unit: 50000000}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100, lease: false}
`)
	c, err := Build([]*File{f}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := `d.api: 50000 per second, fixed_window, lease, metrics as d.api.fw1 (lease.yaml:5)
d.api: 2000000 per minute, sliding_window, lease, metrics as d.api.sw60 (lease.yaml:6)
d.api: 50000000 per hour, fixed_window, metrics as d.api.fw3600 (lease.yaml:7)
d.tenant: 100 per second, fixed_window (lease.yaml:9)
`
	if got := c.Dump(); got != want {
		t.Errorf("Dump() =\n%s\nwant\n%s", got, want)
	}
	p, err := c.Plan("d", []*rlv3.RateLimitDescriptor{configtest.Desc("api=x"), configtest.Desc("tenant=t")}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	var got []string
	for _, h := range p.Hits {
		got = append(got, h.Rule.Lease)
	}
	// The lease carries the name its metrics use; a limit without lease
	// carries none, and neither does a per-request override (its limit
	// changes from request to request, so no slice could outlive one).
	if want := []string{"d.api.fw1", "d.api.sw60", "", ""}; !slices.Equal(got, want) {
		t.Errorf("Rule.Lease per hit = %q, want %q", got, want)
	}
	override := configtest.Desc("api=x")
	override.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_HOUR}
	po, err := c.Plan("d", []*rlv3.RateLimitDescriptor{override}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer po.Release()
	if len(po.Hits) != 1 || po.Hits[0].Rule.Lease != "" {
		t.Errorf("override hits = %+v, want one without lease", po.Hits)
	}
}

// TestSyntaxErrorLines: a YAML syntax error names the line it is about:
// the unclosed bracket, the tab, the line out of a list, the stray one.
func TestSyntaxErrorLines(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		line      int
	}{
		{"unclosed [", "domain: d\ndescriptors:\n  - key: a\n    value: [x, y\n  - key: b\n", 4},
		{"unclosed [ at the end", "domain: d\ndescriptors: [\n", 2},
		{"unclosed {", "domain: d\ndescriptors:\n  - {key: a\n  - key: b\n", 3},
		{"a tab indenting a line", "domain: d\ndescriptors:\n  - key: a\n\t- key: b\n", 4},
		{"a tab before a list", "domain: d\ndescriptors:\n\t- key: a\n", 3},
		{"an unclosed quote", "domain: d\ndescriptors:\n  - key: \"a\n  - key: b\n", 3},
		{"a line indented one too many", "domain: d\ndescriptors:\n  - key: a\n   value: b\n", 4},
		{"a key at the list's indentation", "domain: d\ndescriptors:\n  - key: a\n    value: b\n  key2: b\n", 5},
		{"a colon in a plain value", "domain: d\ndescriptors:\n  - key: a: b\n", 3},
		{"a stray ]", "domain: d\ndescriptors:\n  - key: a\n]\n", 4},
	} {
		_, err := Parse("f.yaml", []byte(tc.src))
		var e *Error
		if !errors.As(err, &e) || !strings.Contains(e.Msg, "invalid YAML") {
			t.Errorf("%s: %v, want an invalid YAML error", tc.name, err)
			continue
		}
		if e.Line != tc.line {
			t.Errorf("%s: %v, want line %d", tc.name, err, tc.line)
		}
	}
}

// TestUnknownFieldSuggests: an unknown field close to a known one (case,
// '_' or '-' aside, or a typo or two away) names it.
func TestUnknownFieldSuggests(t *testing.T) {
	for _, tc := range []struct{ field, want string }{
		{"ratelimit", `unknown field "ratelimit" (did you mean rate_limit?)`},
		{"rateLimit", `unknown field "rateLimit" (did you mean rate_limit?)`},
		{"desciptors", `unknown field "desciptors" (did you mean descriptors?)`},
		{"shadow-mode", `unknown field "shadow-mode" (did you mean shadow_mode?)`},
		{"colour", `unknown field "colour"`},
	} {
		t.Run(tc.field, func(t *testing.T) {
			_, err := Parse("f.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    "+tc.field+": {unit: second, requests_per_unit: 1}\n"))
			if err == nil || !strings.Contains(err.Error(), tc.want) || tc.want == `unknown field "colour"` && strings.Contains(err.Error(), "did you mean") {
				t.Errorf("%s: %v, want %s", tc.field, err, tc.want)
			}
		})
	}
}
