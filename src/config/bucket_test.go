package config

import (
	"strings"
	"testing"
)

func TestBucketEntries(t *testing.T) {
	cfg := mustBuild(t, `
domain: d
descriptors:
  - key: tenant
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: method
        rate_limit: {unit: second, requests_per_unit: 7}
  - key: method
    value: GET
    rate_limit: {unit: second, requests_per_unit: 9}
`)
	for _, tc := range []struct {
		name   string
		bucket map[string]string
		want   string
	}{
		{"follows the tree", map[string]string{"path": "/login", "tenant": "acme"}, "tenant=acme,path=/login"},
		{"a key-only level", map[string]string{"method": "PUT", "tenant": "acme"}, "tenant=acme,method=PUT"},
		{"two keys match the root: the first in the config wins", map[string]string{"method": "GET", "tenant": "acme"}, "tenant=acme,method=GET"},
		{"a root of its own", map[string]string{"method": "GET"}, "method=GET"},
		{"unplaced keys follow, sorted", map[string]string{"zone": "b", "tenant": "acme", "az": "1"}, "tenant=acme,az=1,zone=b"},
		{"nothing matches", map[string]string{"b": "2", "a": "1"}, "a=1,b=2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, e := range cfg.Domain("d").BucketEntries(tc.bucket) {
				got = append(got, e.GetKey()+"="+e.GetValue())
			}
			if strings.Join(got, ",") != tc.want {
				t.Errorf("BucketEntries(%v) = %v, want %s", tc.bucket, got, tc.want)
			}
		})
	}
	p, err := cfg.PlanBucket("d", map[string]string{"path": "/login", "tenant": "acme"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	if len(p.Hits) != 1 || p.Hits[0].Rule.Limit != 5 {
		t.Errorf("PlanBucket reached %v, want the /login rule's limit of 5", p.Hits)
	}
}
