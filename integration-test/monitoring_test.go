package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/openrls/ratelimit/src/config/configtest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

var metricNameRE = regexp.MustCompile(`\bratelimit_[a-z0-9_]+`)

// exported lists the sample names on /metrics (histograms as their _bucket,
// _sum and _count series).
func exported(body string) map[string]bool {
	names := map[string]bool{}
	for _, l := range strings.Split(body, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if i := strings.IndexAny(l, "{ "); i > 0 {
			names[l[:i]] = true
		}
	}
	return names
}

// alertRules is the Prometheus rule file format, strictly: an unknown field
// is an error.
type alertRules struct {
	Groups []struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval"`
		Rules    []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestMonitoringExamplesMatchMetrics starts the service as the dashboard
// and the alerts expect it (Redis with the circuit breaker and the local
// cache), and fails if an expression names a metric it does not export or
// a rule is malformed. The rule file is checked against a strict schema
// and for balanced brackets, not with Prometheus's own parser: that module
// would bring most of Prometheus in as a test dependency.
func TestMonitoringExamplesMatchMetrics(t *testing.T) {
	srv := redistest.Start(t)
	p := start(t, redisEnv(t, map[string]string{"REDIS_URL": srv.Addr, "LOCAL_CACHE_SIZE_IN_BYTES": "1048576"}))
	p.should(t, "shared", configtest.Desc("k=dashboard"))
	names := exported(metricsBody(t, p))

	exprs := map[string][]string{} // file → expressions
	dash, err := os.ReadFile("../examples/monitoring/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string             `json:"title"`
			Type    string             `json:"type"`
			GridPos struct{ W, H int } `json:"gridPos"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(dash, &d); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		t.Errorf("grafana-dashboard.json: title %q, uid %q, %d panels", d.Title, d.UID, len(d.Panels))
	}
	for _, pn := range d.Panels {
		if pn.Title == "" || pn.Type == "" || pn.GridPos.W == 0 || pn.GridPos.H == 0 || len(pn.Targets) == 0 {
			t.Errorf("dashboard panel %q (%s) lacks a title, type, size or query", pn.Title, pn.Type)
		}
		for _, tg := range pn.Targets {
			exprs["grafana-dashboard.json"] = append(exprs["grafana-dashboard.json"], tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(string); ok {
			exprs["grafana-dashboard.json"] = append(exprs["grafana-dashboard.json"], q)
		}
	}

	data, err := os.ReadFile("../examples/monitoring/prometheus-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules alertRules
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatalf("prometheus-rules.yaml: %v", err)
	}
	if len(rules.Groups) == 0 {
		t.Fatal("prometheus-rules.yaml has no groups")
	}
	for _, g := range rules.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("rule group %q is unnamed or empty", g.Name)
		}
		for _, r := range g.Rules {
			if r.Alert == "" || strings.TrimSpace(r.Expr) == "" {
				t.Errorf("rule %q: an alert needs a name and an expr", r.Alert)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("rule %q: for %q: %v", r.Alert, r.For, err)
				}
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("rule %q: severity %q, want warning or critical", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("rule %q: needs a summary and a description", r.Alert)
			}
			exprs["prometheus-rules.yaml"] = append(exprs["prometheus-rules.yaml"], r.Expr)
		}
	}

	for file, list := range exprs {
		for _, e := range list {
			if !balanced(e) {
				t.Errorf("%s: unbalanced brackets in %q", file, e)
			}
			for _, name := range metricNameRE.FindAllString(e, -1) {
				if !names[name] {
					t.Errorf("%s: %q names %s, which /metrics does not export", file, e, name)
				}
			}
		}
	}
}

// balanced reports whether e's (), [] and {} pair up, outside quotes.
func balanced(e string) bool {
	var stack []rune
	pairs := map[rune]rune{')': '(', ']': '[', '}': '{'}
	quoted := false
	for _, c := range e {
		switch {
		case c == '"':
			quoted = !quoted
		case quoted:
		case c == '(' || c == '[' || c == '{':
			stack = append(stack, c)
		case pairs[c] != 0:
			if len(stack) == 0 || stack[len(stack)-1] != pairs[c] {
				return false
			}
			stack = stack[:len(stack)-1]
		}
	}
	return len(stack) == 0 && !quoted
}
