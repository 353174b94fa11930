package config

import (
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/openrls/ratelimit/src/escape"
)

const explainConfig = `domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5, name: per_user}
  - key: path
    value: /a*
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: '*/b'
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: vip
    value: yes
    rate_limit: {unit: minute, requests_per_unit: 50, replaces: [{name: per_user}]}
  - key: org
    descriptors:
      - key: team
        rate_limit: {unit: hour, requests_per_unit: 9}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: export
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 3, algorithm: concurrency}
  - key: daily
    rate_limit: {unit: day, requests_per_unit: 1000, calendar: Pacific/Kiritimati}
`

// explainNow is the instant Explain is asked at: 07:00 UTC, 21:00 in
// Pacific/Kiritimati (UTC+14).
var explainNow = time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)

func explainOf(t *testing.T, domain string, descs ...string) string {
	t.Helper()
	c := mustBuild(t, explainConfig)
	var ds []*rlv3.RateLimitDescriptor
	for _, d := range descs {
		desc := &rlv3.RateLimitDescriptor{}
		for _, kv := range strings.Split(d, ",") {
			k, v, _ := strings.Cut(kv, "=")
			desc.Entries = append(desc.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		}
		ds = append(ds, desc)
	}
	var b strings.Builder
	if err := c.Explain(&b, explainNow, domain, ds); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestExplain(t *testing.T) {
	tests := []struct {
		name   string
		domain string
		descs  []string
		want   string
	}{
		{"wildcards: the first in the config wins", "d", []string{"path=/a/b"},
			`descriptors[0] path=/a/b
  path=/a/b: wildcard "/a*" (test.yaml:5)
    also matched, lost: wildcard "*/b" (test.yaml:8): "/a*" comes first in the config
  rule: path_/a* (test.yaml:5)
  limit: 1 per minute, fixed_window  key {1:d4:path4:/a/b}:fw60
`},
		{"replaces across the request", "d", []string{"user=u", "vip=yes"},
			`descriptors[0] user=u
  user=u: key only, any value (test.yaml:3)
  rule: user (test.yaml:3)
  replaced: 5 per minute, fixed_window, name "per_user" (another descriptor of the request replaces "per_user")
descriptors[1] vip=yes
  vip=yes: exact value (test.yaml:11)
  rule: vip_yes (test.yaml:11)
  limit: 50 per minute, fixed_window, replaces ["per_user"]  key {1:d3:vip3:yes}:fw60
`},
		{"nested: a limit only at its depth", "d", []string{"org=o", "org=o,team=t", "org=o,team=t,extra=x"},
			`descriptors[0] org=o
  org=o: key only, any value (test.yaml:14)
  rule: org (test.yaml:14)
  limit: none at this depth (limits apply at the depth of the request's last entry)
descriptors[1] org=o,team=t
  org=o: key only, any value (test.yaml:14)
  team=t: key only, any value (test.yaml:16)
  rule: org.team (test.yaml:16)
  limit: 9 per hour, fixed_window  key {1:d3:org1:o4:team1:t}:fw3600
descriptors[2] org=o,team=t,extra=x
  org=o: key only, any value (test.yaml:14)
  team=t: key only, any value (test.yaml:16)
  extra=x: no rule at depth 3 has key "extra" (or its value): nothing matches
  rule: none: answered OK without a limit
`},
		{"shadow mode: counted, never rejects", "d", []string{"trial=t"},
			`descriptors[0] trial=t
  trial=t: key only, any value (test.yaml:18)
  rule: trial (test.yaml:18)
  limit: 1 per hour, fixed_window  key {1:d5:trial1:t}:fw3600
  shadow_mode: counted, and never rejects: past the limit the answer is still OK (the over-limit stats say it would have been rejected)
`},
		{"concurrency: slots, each held at most its unit", "d", []string{"export=e"},
			`descriptors[0] export=e
  export=e: key only, any value (test.yaml:21)
  rule: export (test.yaml:21)
  limit: 3 in flight, a slot held at most 5 minutes, concurrency  key {1:d6:export1:e}:cc300
`},
		{"calendar: the window as of now and its next reset", "d", []string{"daily=x"},
			`descriptors[0] daily=x
  daily=x: key only, any value (test.yaml:23)
  rule: daily (test.yaml:23)
  limit: 1000 per day, fixed_window, calendar Pacific/Kiritimati  key {1:d5:daily1:x}:fw86400@Pacific/Kiritimati
  calendar: window 2026-12-02 00:00 +14 to 2026-12-03 00:00 +14, next reset in 3h0m0s
`},
		{"unknown domain", "zz", []string{"a=b"}, "domain \"zz\": not in the config: every descriptor is answered OK without a limit\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := explainOf(t, tc.domain, tc.descs...); got != tc.want {
				t.Errorf("Explain =\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

// TestParseRequest: the text form is escaped as a decoded request is, so
// /explain and config-check match what the service would.
func TestParseRequest(t *testing.T) {
	for _, tc := range []struct {
		name, domain string
		descs        []string
		want         []string // key=value of each entry, escaped
		wantErr      bool
	}{
		{"plain", "d", []string{"a=1,b=2", "c="}, []string{"a=1", "b=2", "c="}, false},
		{"hostile bytes escaped", "d\xff", []string{"k\\=v\xfe"}, []string{`k\\=v\xfe`}, false},
		{"not key=value", "d", []string{"novalue"}, nil, true},
		{"empty key", "d", []string{"=v"}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := ParseRequest(tc.domain, tc.descs)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if want := escape.String(tc.domain); req.Domain != want {
				t.Errorf("domain %q, want %q", req.Domain, want)
			}
			var got []string
			for _, d := range req.Descriptors {
				for _, e := range d.Entries {
					got = append(got, e.Key+"="+e.Value)
				}
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("entries %q, want %q", got, tc.want)
			}
		})
	}
}
