package integration

import (
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/config/configtest"
)

// sinkConfig: 2 an hour, so three hits give total_hits 3, over_limit 1.
const sinkConfig = `
domain: DOMAIN
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 2}
`

// dogEnv is the reference README's DogStatsD example: one mogrifier that
// turns a per-rule name into the stat's name and domain and descriptor
// tags, and EXTRA_TAGS.
func dogEnv(port int) map[string]string {
	return map[string]string{
		"USE_STATSD": "false", "USE_DOG_STATSD": "true", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": strconv.Itoa(port),
		"STATS_FLUSH_INTERVAL": "200ms", "EXTRA_TAGS": "env:acc",
		"USE_DOG_STATSD_MOGRIFIERS":         "HITS",
		"DOG_STATSD_MOGRIFIER_HITS_PATTERN": `^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$`,
		"DOG_STATSD_MOGRIFIER_HITS_NAME":    "ratelimit.service.rate_limit.$3",
		"DOG_STATSD_MOGRIFIER_HITS_TAGS":    "domain:$1,descriptor:$2",
	}
}

// TestDogStatsdLinesWithTheReferenceMogrifiers runs the binary with the
// reference README's DogStatsD settings and reads the agent's UDP socket:
// the per-rule counters arrive as one name with tags, EXTRA_TAGS first,
// and the response time as a timer.
func TestDogStatsdLinesWithTheReferenceMogrifiers(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	env := writeConfig(t, map[string]string{"dog.yaml": strings.Replace(sinkConfig, "DOMAIN", "dog", 1)})
	for k, v := range dogEnv(pc.LocalAddr().(*net.UDPAddr).Port) {
		env[k] = v
	}
	p := start(t, env)
	for range 3 {
		p.should(t, "dog", configtest.Desc("k=v"))
	}
	want := map[string]bool{
		"ratelimit.service.rate_limit.total_hits:3|c|#env:acc,domain:dog,descriptor:k": false,
		"ratelimit.service.rate_limit.over_limit:1|c|#env:acc,domain:dog,descriptor:k": false,
	}
	timer := false
	_ = pc.SetReadDeadline(time.Now().Add(60 * time.Second))
	buf := make([]byte, 64<<10)
	var seen []string
	for !timer || !all(want) {
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatalf("DogStatsD lines missing (want %v, a response time timer: %v); got %q", want, timer, seen)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(buf[:n])), "\n") {
			seen = append(seen, line)
			if _, ok := want[line]; ok {
				want[line] = true
			}
			if strings.HasPrefix(line, "ratelimit_server.ShouldRateLimit.response_time:") && strings.HasSuffix(line, "|ms|#env:acc") {
				timer = true
			}
			if strings.Contains(line, ".__") {
				t.Errorf("line %q carries a tag in its name, not as a DogStatsD tag", line)
			}
		}
	}
}

func all(m map[string]bool) bool {
	for _, v := range m {
		if !v {
			return false
		}
	}
	return true
}

// TestStatsSinkSettingsThatStopStartUp: two sinks at once is the
// reference's start-up error; a mogrifier without its pattern, or with one
// that does not compile, and a mapping file that does not parse are named.
func TestStatsSinkSettingsThatStopStartUp(t *testing.T) {
	mapping := filepath.Join(t.TempDir(), "mapping.yaml")
	if err := os.WriteFile(mapping, []byte("mappings:\n  - match: a.b\n    name: [oops\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"dogstatsd beside statsd", map[string]string{"USE_STATSD": unset}, "unable to use more than one stats sink"},
		{"no pattern", map[string]string{"DOG_STATSD_MOGRIFIER_HITS_PATTERN": unset}, "DOG_STATSD_MOGRIFIER_HITS_PATTERN is not set"},
		{"bad pattern", map[string]string{"DOG_STATSD_MOGRIFIER_HITS_PATTERN": "(["}, "DOG_STATSD_MOGRIFIER_HITS_PATTERN: error parsing regexp"},
		{"mapping that does not parse", map[string]string{"USE_DOG_STATSD": "false", "USE_PROMETHEUS": "true",
			"PROMETHEUS_ADDR": "127.0.0.1:0", "PROMETHEUS_MAPPER_YAML": mapping}, mapping + ": yaml: line 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := writeConfig(t, map[string]string{"dog.yaml": strings.Replace(sinkConfig, "DOMAIN", "dog", 1)})
			for k, v := range dogEnv(9) {
				env[k] = v
			}
			for k, v := range tc.env {
				env[k] = v
			}
			exitsSaying(t, env, tc.want)
		})
	}
}

// promMapping uses the statsd_exporter features the reference's users
// write: a glob with labels, a regular expression, a drop, and the response
// time timer as a histogram of its own buckets (milliseconds, as the
// reference hands it over).
const promMapping = `
defaults:
  observer_type: histogram
mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: acc_limited_total_hits
    labels:
      domain: "$1"
      rule: "$2"
  - match: 'ratelimit\.service\.rate_limit\.([^.]+)\.([^.]+)\.over_limit'
    match_type: regex
    name: acc_over
    labels:
      domain: "$1"
      rule: "$2"
  - match: "ratelimit.go.*"
    action: drop
    name: dropped
  - match: "ratelimit_server.ShouldRateLimit.response_time"
    name: acc_response_ms
    histogram_options:
      buckets: [0.5, 1, 1000]
`

// TestPrometheusMapperYAML runs the binary with USE_PROMETHEUS and a
// statsd_exporter mapping and scrapes PROMETHEUS_ADDR: the user's names
// and labels, nothing of what the mapping drops, the timer as the
// mapping's histogram, and the exporter's default name for what no line
// maps.
func TestPrometheusMapperYAML(t *testing.T) {
	mapping := filepath.Join(t.TempDir(), "mapping.yaml")
	if err := os.WriteFile(mapping, []byte(promMapping), 0o644); err != nil {
		t.Fatal(err)
	}
	env := writeConfig(t, map[string]string{"prom.yaml": strings.Replace(sinkConfig, "DOMAIN", "prom", 1)})
	addr := "127.0.0.1:" + strconv.Itoa(freePorts(t, 1)[0])
	env["USE_STATSD"] = "false"
	env["USE_PROMETHEUS"] = "true"
	env["PROMETHEUS_ADDR"] = addr
	env["PROMETHEUS_MAPPER_YAML"] = mapping
	env["STATS_FLUSH_INTERVAL"] = "200ms"
	p := start(t, env)
	for range 3 {
		p.should(t, "prom", configtest.Desc("k=v"))
	}
	want := []string{
		`acc_limited_total_hits{domain="prom",rule="k"} 3`,
		`acc_over{domain="prom",rule="k"} 1`,
		`acc_response_ms_bucket{le="1000"} 3`,
		`acc_response_ms_count 3`,
		// Unmapped: the exporter's default name.
		"ratelimit_service_config_load_success 1",
	}
	var body string
	eventually(t, "the mapped series on PROMETHEUS_ADDR", func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		body = readBody(resp)
		for _, w := range want {
			if !strings.Contains(body, w) {
				return false
			}
		}
		return true
	})
	for _, not := range []string{"ratelimit_go_", "ratelimit_service_rate_limit_prom_k_total_hits", "ratelimit_requests_total"} {
		if strings.Contains(body, not) {
			t.Errorf("PROMETHEUS_ADDR serves %s, which the mapping drops, maps elsewhere or does not make:\n%s", not, body)
		}
	}
}
