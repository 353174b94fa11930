package config

import (
	"flag"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/limiter"
)

var update = flag.Bool("update", false, "rewrite golden files")

func loadExample(t testing.TB) *Config {
	t.Helper()
	c, err := LoadFiles([]string{"testdata/good/example.yaml"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestDumpGolden(t *testing.T) {
	got := loadExample(t).Dump()
	const golden = "testdata/good/example.golden"
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("Dump() =\n%s\nwant (%s; run go test -update to rewrite)\n%s", got, golden, want)
	}
}

func TestMatch(t *testing.T) {
	c := loadExample(t)
	tests := []struct {
		name    string
		entries []string
		want    string // matched node path, "" for no match
	}{
		{"key only", []string{"remote_address=1.2.3.4"}, "remote_address"},
		{"exact beats key only", []string{"remote_address=50.0.0.5"}, "remote_address_50.0.0.5"},
		{"wildcard prefix", []string{"path=/api/v1/users"}, "path_/api/*"},
		{"first wildcard in the config wins", []string{"path=/api/v2/users"}, "path_/api/*"},
		{"wildcard star first", []string{"path=/x/health"}, "path_*/health"},
		{"wildcard matches empty remainder", []string{"path=/api/"}, "path_/api/*"},
		{"wildcard no match", []string{"path=/web/index"}, ""},
		{"unknown key", []string{"nope=1"}, ""},
		{"nested", []string{"message_type=marketing", "to_number=123"}, "message_type_marketing.to_number"},
		{"limit only at the last entry's depth", []string{"remote_address=1.2.3.4", "extra=1"}, ""},
		{"parent without its child", []string{"message_type=marketing"}, "message_type_marketing"},
		{"nested parent value mismatch", []string{"message_type=other", "to_number=1"}, ""},
		{"empty value is a value", []string{"remote_address="}, "remote_address"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := c.Domain("shop").Match(configtest.Desc(tc.entries...).Entries)
			got := ""
			if n != nil {
				got = n.path
			}
			if got != tc.want {
				t.Errorf("Match(%v) = %q, want %q", tc.entries, got, tc.want)
			}
		})
	}
}

func TestGlobMatch(t *testing.T) {
	tests := []struct {
		pattern, s string
		want       bool
	}{
		{"a*", "a", true}, {"a*", "abc", true}, {"a*", "ba", false},
		{"*a", "ba", true}, {"*a", "ab", false},
		{"a*b*c", "abc", true}, {"a*b*c", "axxbyyc", true}, {"a*b*c", "acb", false},
		{"ab*ba", "aba", false}, {"ab*ba", "abba", true},
		{"*", "", true}, {"**", "x", true},
	}
	for _, tc := range tests {
		if got := globMatch(strings.Split(tc.pattern, "*"), tc.s); got != tc.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", tc.pattern, tc.s, got, tc.want)
		}
	}
}

// planSummary renders a plan compactly: per descriptor, its limits and costs.
func planSummary(p *Plan) string {
	var b strings.Builder
	for i, d := range p.Descs {
		if i > 0 {
			b.WriteString(" | ")
		}
		if d.Unlimited {
			b.WriteString("unlimited")
		}
		for j := d.First; j < d.First+d.Count; j++ {
			h := p.Hits[j]
			if j > d.First {
				b.WriteString(" & ")
			}
			b.WriteString(p.Refs[j].Limit.String())
			b.WriteString(" cost ")
			b.WriteString(strconv.FormatUint(h.Cost, 10))
			if h.Advisory {
				b.WriteString(" advisory")
			}
		}
		if d.Count == 0 && !d.Unlimited {
			b.WriteString("-")
		}
	}
	return b.String()
}

func TestPlan(t *testing.T) {
	c := loadExample(t)
	override := func(d *rlv3.RateLimitDescriptor, rpu uint32, u typev3.RateLimitUnit) *rlv3.RateLimitDescriptor {
		d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: u}
		return d
	}
	addend := func(d *rlv3.RateLimitDescriptor, n uint64) *rlv3.RateLimitDescriptor {
		d.HitsAddend = wrapperspb.UInt64(n)
		return d
	}
	tests := []struct {
		name   string
		domain string
		descs  []*rlv3.RateLimitDescriptor
		addend uint32
		want   string
	}{
		{"unknown domain", "nope", []*rlv3.RateLimitDescriptor{configtest.Desc("remote_address=1")}, 0, "-"},
		{"no match", "shop", []*rlv3.RateLimitDescriptor{configtest.Desc("nope=1")}, 0, "-"},
		{"hits_addend 0 means 1", "shop", []*rlv3.RateLimitDescriptor{configtest.Desc("remote_address=1")}, 0, "10 per second, fixed_window cost 1"},
		{"request hits_addend", "shop", []*rlv3.RateLimitDescriptor{configtest.Desc("remote_address=1")}, 3, "10 per second, fixed_window cost 3"},
		{"descriptor hits_addend wins", "shop", []*rlv3.RateLimitDescriptor{addend(configtest.Desc("remote_address=1"), 7)}, 3, "10 per second, fixed_window cost 7"},
		{"descriptor hits_addend 0 checks only", "shop", []*rlv3.RateLimitDescriptor{addend(configtest.Desc("remote_address=1"), 0)}, 3, "10 per second, fixed_window cost 0"},
		{"unlimited", "shop", []*rlv3.RateLimitDescriptor{configtest.Desc("path=/a/health")}, 0, "unlimited"},
		{"several limits, shadow is advisory", "shop", []*rlv3.RateLimitDescriptor{configtest.Desc("user=u")}, 0,
			"10 per second, token_bucket, burst 20 cost 1 advisory & 1000 per hour, sliding_window cost 1 advisory"},
		{"quota is advisory", "shop", []*rlv3.RateLimitDescriptor{configtest.Desc("quota=q")}, 0, "3 per 5 minutes, fixed_window cost 1 advisory"},
		{"replaces drops the named limit", "shop", []*rlv3.RateLimitDescriptor{
			configtest.Desc("message_type=marketing", "to_number=1"), configtest.Desc("vip=yes", "to_number=1")}, 0,
			`- | 50 per day, fixed_window, replaces ["marketing"] cost 1`},
		{"named limit alone stays", "shop", []*rlv3.RateLimitDescriptor{configtest.Desc("message_type=marketing", "to_number=1")}, 0,
			`5 per day, fixed_window, name "marketing" cost 1`},
		{"override without match", "shop", []*rlv3.RateLimitDescriptor{override(configtest.Desc("nope=1"), 42, typev3.RateLimitUnit_HOUR)}, 0,
			"42 per hour, fixed_window cost 1"},
		{"override keeps matched algorithm", "shop", []*rlv3.RateLimitDescriptor{override(configtest.Desc("user=u"), 7, typev3.RateLimitUnit_MINUTE)}, 0,
			"7 per minute, token_bucket cost 1 advisory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := c.Plan(tc.domain, tc.descs, tc.addend)
			if err != nil {
				t.Fatalf("Plan() error: %v", err)
			}
			if got := planSummary(p); got != tc.want {
				t.Errorf("Plan() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestPlanOverrideUnknownUnit(t *testing.T) {
	d := configtest.Desc("remote_address=1")
	d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}
	if _, err := loadExample(t).Plan("shop", []*rlv3.RateLimitDescriptor{d}, 0); err == nil {
		t.Errorf("Plan(override with UNKNOWN unit) = nil error, want an error")
	}
}

func TestPlanKeys(t *testing.T) {
	c := loadExample(t)
	key := func(kvs ...string) string {
		p, err := c.Plan("shop", []*rlv3.RateLimitDescriptor{configtest.Desc(kvs...)}, 0)
		if err != nil || len(p.Hits) != 1 {
			t.Fatalf("Plan(%v) = %v hits, %v", kvs, len(p.Hits), err)
		}
		return p.Hits[0].Key
	}
	if a, b := key("tenant=free-1"), key("tenant=free-2"); a != b {
		t.Errorf("share_threshold: keys %q and %q differ, want one shared key", a, b)
	}
	if a, b := key("remote_address=1"), key("remote_address=2"); a == b {
		t.Errorf("key-only descriptor: values 1 and 2 share key %q, want one key per value", a)
	}
	if a, b := key("path=/api/x"), key("path=/api/y"); a == b {
		t.Errorf("wildcard without share_threshold: values share key %q, want one key per value", a)
	}
	if got, want := key("remote_address=1"), "{4:shop14:remote_address1:1}:fw1"; got != want {
		t.Errorf("key = %q, want %q", got, want)
	}
	long := strings.Repeat("v", maxRawField+1)
	if got := key("remote_address=" + long); len(got) > 100 || !strings.Contains(got, "129#") {
		t.Errorf("key for a %d-byte value = %q, want it hashed and short", len(long), got)
	}
}

func TestLimitRule(t *testing.T) {
	c := loadExample(t)
	n := c.Domain("shop").Match(configtest.Desc("quota=q").Entries)
	// A fixed window counts rejected hits unless told otherwise, as
	// envoyproxy/ratelimit does (REJECTED_HITS, rejected_hits).
	want := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 3, Period: 5 * 60 * 1e9, CountRejected: true}
	if got := n.limits[0].Rule; got != want {
		t.Errorf("Rule = %+v, want %+v", got, want)
	}
	if n.metadata["team"] != "payments" {
		t.Errorf("Metadata = %v, want team=payments", n.metadata)
	}
}

func BenchmarkPlan(b *testing.B) {
	c := loadExample(b)
	descs := []*rlv3.RateLimitDescriptor{configtest.Desc("remote_address=10.1.2.3"), configtest.Desc("path=/api/v2/users"), configtest.Desc("message_type=marketing", "to_number=555")}
	b.ReportAllocs()
	for b.Loop() {
		p, err := c.Plan("shop", descs, 1)
		if err != nil {
			b.Fatal(err)
		}
		p.Release()
	}
}

func BenchmarkMatch(b *testing.B) {
	c := loadExample(b)
	d := c.Domain("shop")
	entries := configtest.Desc("message_type=marketing", "to_number=555").Entries
	b.ReportAllocs()
	for b.Loop() {
		if d.Match(entries) == nil {
			b.Fatal("no match")
		}
	}
}

func TestHashedValuesInKeys(t *testing.T) {
	src := "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: user\n    hash_value: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	key := func(c *Config, kv string) string {
		p, err := c.Plan("d", []*rlv3.RateLimitDescriptor{configtest.Desc(kv)}, 0)
		if err != nil || len(p.Hits) != 1 {
			t.Fatalf("Plan(%s): %v", kv, err)
		}
		return p.Hits[0].Key
	}
	plain := mustBuild(t, src)
	global, err := Build([]*File{mustParse(t, "test.yaml", src)}, Options{HashValues: true})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  *Config
		kv   string
		raw  bool
	}{
		{"plain value", plain, "ip=203.0.113.7", true},
		{"hash_value on the descriptor", plain, "user=alice@example.com", false},
		{"CACHE_KEY_HASH_VALUES", global, "ip=203.0.113.7", false},
	}
	for _, tc := range tests {
		k := key(tc.cfg, tc.kv)
		_, value, _ := strings.Cut(tc.kv, "=")
		if got := strings.Contains(k, value); got != tc.raw {
			t.Errorf("%s: key %q contains the raw value = %v, want %v", tc.name, k, got, tc.raw)
		}
	}
	if a, b := key(global, "ip=1"), key(global, "ip=2"); a == b {
		t.Errorf("hashed keys of different values are equal: %q", a)
	}
}

func TestReach(t *testing.T) {
	d := loadExample(t).Domain("shop")
	tests := []struct {
		name  string
		shape []ShapeEntry
		want  string
	}{
		{"dynamic key-only", []ShapeEntry{{Key: "remote_address", Dynamic: true}}, "remote_address remote_address_50.0.0.5"},
		{"fixed value", []ShapeEntry{{Key: "remote_address", Value: "50.0.0.5"}}, "remote_address_50.0.0.5"},
		{"nested, fixed then dynamic", []ShapeEntry{{Key: "message_type", Value: "marketing"}, {Key: "to_number", Dynamic: true}}, "message_type_marketing.to_number"},
		{"too deep", []ShapeEntry{{Key: "remote_address", Dynamic: true}, {Key: "x", Dynamic: true}}, ""},
		{"unknown key", []ShapeEntry{{Key: "nope", Dynamic: true}}, ""},
	}
	for _, tc := range tests {
		got := d.Reach(tc.shape)
		sort.Strings(got)
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%s: Reach() = %q, want %q", tc.name, got, tc.want)
		}
	}
	if n := len(d.LimitPaths()); n != 11-1 { // user has two limits on one path
		t.Errorf("LimitPaths() has %d paths, want 10", n)
	}
}

// TestVersion: a config's version follows its rules, not its text: the
// same rules written otherwise share it, a changed limit changes it.
func TestVersion(t *testing.T) {
	a := mustBuild(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	b := mustBuild(t, "# a comment\ndomain: d\ndescriptors:\n  - rate_limit:\n      requests_per_unit: 5\n      unit: minute\n    key: k\n")
	c := mustBuild(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 6}\n")
	if a.Version() != b.Version() {
		t.Errorf("same rules, versions %s and %s", a.Version(), b.Version())
	}
	if a.Version() == c.Version() || len(a.Version()) != 16 {
		t.Errorf("versions %q and %q: want 16 hex digits, different for a changed limit", a.Version(), c.Version())
	}
}

// TestPlanValues: a plan names its descriptors' values as their counter
// keys hold them, read back from the keys (no second match): as sent,
// hashed where the key hashes, a shared wildcard as its pattern, and
// entries past the config as sent.
func TestPlanValues(t *testing.T) {
	c := mustBuild(t, `domain: v
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: ip
    hash_value: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: /api/*
    share_threshold: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 1}
`)
	long := strings.Repeat("x", maxRawField+1)
	hash := func(s string) string { return "#" + string(appendHash(nil, s)) }
	for _, tc := range []struct {
		entries []string
		want    string
	}{
		{[]string{"user=alice"}, "user=alice"},
		{[]string{"user=" + long}, "user=" + hash(long)},
		{[]string{"ip=10.0.0.1"}, "ip=" + hash("10.0.0.1")},
		{[]string{"path=/api/x", "method=GET"}, "path=/api/*,method=GET"},
		{[]string{"nope=1", "more=2"}, "nope=1,more=2"},
		{[]string{"a=b,c=d:e"}, "a=b,c=d:e"},
	} {
		p, err := c.Plan("v", []*rlv3.RateLimitDescriptor{configtest.Desc(tc.entries...)}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Values(0); got != tc.want {
			t.Errorf("Values(%v) = %q, want %q", tc.entries, got, tc.want)
		}
		p.Release()
	}
}
