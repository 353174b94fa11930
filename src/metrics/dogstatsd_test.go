package metrics

import (
	"regexp"
	"slices"
	"testing"
)

func TestDogName(t *testing.T) {
	hits := Mogrifier{Pattern: regexp.MustCompile(`^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$`),
		Name: "ratelimit.service.rate_limit.$3", Tags: []MogrifierTag{{"domain", "$1"}, {"descriptor", "$2"}}}
	other := Mogrifier{Pattern: regexp.MustCompile(`^ratelimit\.(.*)$`), Name: "rl.$1.$9"}
	for _, c := range []struct {
		in       string
		mogs     []Mogrifier
		name     string
		wantTags []string
	}{
		{"ratelimit.service.rate_limit.dog.k.total_hits.__env=acc", []Mogrifier{hits, other},
			"ratelimit.service.rate_limit.total_hits", []string{"env:acc", "domain:dog", "descriptor:k"}},
		{"ratelimit.service.rate_limit.dog.k.v.over_limit", []Mogrifier{hits},
			"ratelimit.service.rate_limit.over_limit", []string{"domain:dog", "descriptor:k.v"}},
		// The first that matches wins; a group past the match stays as written.
		{"ratelimit.go.heapAlloc", []Mogrifier{hits, other}, "rl.go.heapAlloc.$9", nil},
		{"ratelimit_server.ShouldRateLimit.response_time.__a=1.__b=2", []Mogrifier{hits},
			"ratelimit_server.ShouldRateLimit.response_time", []string{"a:1", "b:2"}},
		{"plain.name", nil, "plain.name", nil},
	} {
		name, tags := dogName(c.in, c.mogs)
		if name != c.name || !slices.Equal(tags, c.wantTags) {
			t.Errorf("dogName(%q) = %q %q, want %q %q", c.in, name, tags, c.name, c.wantTags)
		}
	}
}
