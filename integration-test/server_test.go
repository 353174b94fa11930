package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/openrls/ratelimit/src/config/configtest"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

const basicConfig = `
domain: it
descriptors:
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 2
  - key: bucket
    rate_limit:
      unit: hour
      requests_per_unit: 3
      algorithm: token_bucket
`

func postJSON(t *testing.T, p *proc, body string) (int, string) {
	t.Helper()
	resp, err := http.Post("http://"+p.httpAddr+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestMemoryBackendOverGRPCAndHTTP(t *testing.T) {
	p := start(t, writeConfig(t, map[string]string{"it.yaml": basicConfig}))

	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp := p.should(t, "it", configtest.Desc("user=alice"))
		if resp.GetOverallCode() != want {
			t.Errorf("call %d: overall_code = %v, want %v", i, resp.GetOverallCode(), want)
		}
		st := resp.GetStatuses()[0]
		if st.GetCurrentLimit().GetRequestsPerUnit() != 2 || st.GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
			t.Errorf("call %d: current_limit = %v, want 2/HOUR", i, st.GetCurrentLimit())
		}
		if d := st.GetDurationUntilReset().AsDuration(); d <= 0 || d > time.Hour {
			t.Errorf("call %d: duration_until_reset = %v, want within the hour", i, d)
		}
	}
	if got := p.should(t, "it", configtest.Desc("bucket=b")).GetStatuses()[0].GetLimitRemaining(); got != 2 {
		t.Errorf("token bucket limit_remaining after 1 of 3 = %d, want 2", got)
	}

	body := `{"domain":"it","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}`
	for i, want := range []int{200, 200, 429} {
		if code, out := postJSON(t, p, body); code != want || !strings.Contains(out, "overallCode") {
			t.Errorf("POST /json call %d = %d %s, want %d", i, code, out, want)
		}
	}
	if code, out := postJSON(t, p, `{"domain":""}`); code != 400 || !strings.Contains(out, "domain is empty") {
		t.Errorf("POST /json bad request = %d %q, want 400 naming the problem", code, out)
	}

	_, err := p.client().ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "it"})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("ShouldRateLimit(no descriptors) error = %v, want InvalidArgument", err)
	}

	// The server as a whole, the reference's service name (what its
	// probes name) and the RLS's full name.
	for _, name := range []string{"", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"} {
		h, err := healthpb.NewHealthClient(p.conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("grpc health for %q = %v, %v; want SERVING", name, h, err)
		}
	}

	resp, err := http.Get("http://" + p.debugAddr + "/rlconfig")
	if err != nil {
		t.Fatal(err)
	}
	dump, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(dump), "it.user: 2 per hour, fixed_window") {
		t.Errorf("/rlconfig = %q, want the user limit", dump)
	}
	resp, err = http.Get("http://" + p.debugAddr + "/rlconfig?summary")
	if err != nil {
		t.Fatal(err)
	}
	if _, got, _ := strings.Cut(readBody(resp), "\n"); !strings.HasPrefix(got, "it: 2 rules (0 wildcard), 2 limits, from ") {
		t.Errorf("/rlconfig?summary = %q, want the version line, then one line for domain it", got)
	}

	// The reference's debug port answers /stats with its statsd names, and
	// lists its endpoints at /.
	for _, c := range []struct{ path, want string }{
		{"/stats", "ratelimit.service.rate_limit.it.user.over_limit: 2\n"}, // alice and bob, once each
		{"/stats", "ratelimit.service.config_load_success: 1\n"},
		{"/stats", "\nmemstats: {\"Alloc\":"}, // Go's expvar, as the reference prints
		{"/stats", "\ncmdline: [\""},
		{"/", "/rlconfig\n/rlqs\n/stats\n"},
	} {
		path, want := c.path, c.want
		resp, err := http.Get("http://" + p.debugAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Errorf("debug %s = %d %q, want 200 containing %q", path, resp.StatusCode, body, want)
		}
	}
}

func TestReflectionListsServices(t *testing.T) {
	p := start(t, writeConfig(t, map[string]string{"it.yaml": basicConfig}))
	stream, err := reflectionpb.NewServerReflectionClient(p.conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	r, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range r.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !strings.Contains(strings.Join(names, ","), "envoy.service.ratelimit.v3.RateLimitService") {
		t.Errorf("reflection services = %v, want the RLS service", names)
	}
}

func TestStartupFailures(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"bad config file", writeConfig(t, map[string]string{"bad.yaml": "domain: x\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n"}),
			`bad.yaml:5: descriptors[0].rate_limit.unit: unknown unit "fortnight"`},
		{"bad setting", map[string]string{"PORT": "eighty"}, `ratelimit: invalid settings: PORT: invalid value "eighty"`},
		{"every bad setting at once", map[string]string{"PORT": "eighty", "GRPC_PORT": "x"},
			`ratelimit: invalid settings: PORT: invalid value "eighty": want int; GRPC_PORT: invalid value "x": want int`},
		{"bad settings that parse and that do not", map[string]string{"REDIS_TIMEOUT": "abc", "BACKEND_FAILURE_POLICY": "maybe"},
			`ratelimit: invalid settings: REDIS_TIMEOUT: invalid value "abc": want a duration such as 500ms, 10s or 1h; BACKEND_FAILURE_POLICY: `},
		{"missing config dir", map[string]string{"RUNTIME_ROOT": "/nonexistent-dir-for-test"}, "the config directory /nonexistent-dir-for-test/config does not exist"},
		{"duplicate domain", writeConfig(t, map[string]string{"a.yaml": "domain: x\n", "b.yaml": "domain: x\n"}), `duplicate domain "x"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runToExit(t, tc.env)
			if code != 1 || !strings.Contains(out, tc.want) {
				t.Errorf("exit %d, output:\n%s\nwant exit 1 and %q", code, out, tc.want)
			}
			if strings.Contains(out, "goroutine ") {
				t.Errorf("output has a stack trace:\n%s", out)
			}
			if strings.Contains(out, "last good config") {
				t.Errorf("at start-up there is no last good config, but the log says so:\n%s", out)
			}
			if n := strings.Count(out, tc.want); n != 1 {
				t.Errorf("the error is printed %d times, want once:\n%s", n, out)
			}
		})
	}
}

func TestForceStartWithoutConfig(t *testing.T) {
	p := start(t, map[string]string{"RUNTIME_ROOT": t.TempDir() + "/missing", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true"})
	_, err := p.client().ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "it", Descriptors: nil})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("bad request without config: %v, want InvalidArgument", err)
	}
	_, err = p.client().ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(configtest.Desc("user=a"))})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "no rate limit configuration") {
		t.Errorf("request without config: %v, want Unavailable", err)
	}
}

// TestBinaryExplainsItself: the server answers -h/--help with its usage
// and --version with its build, exiting 0 without starting; serving, it
// logs its version at start-up and exports ratelimit_build_info.
func TestBinaryExplainsItself(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-h"}, "Usage:\n  ratelimit "},
		{[]string{"--help"}, "docs/settings.md"},
		{[]string{"--version"}, "ratelimit "},
		{[]string{"version"}, " go1."},
	} {
		out, err := exec.Command(serverBin, tc.args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("server %v: %v, %q; want exit 0 and %q", tc.args, err, out, tc.want)
		}
	}
	version, err := exec.Command(serverBin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(version)) // ratelimit VERSION (revision REV...) GO
	p := start(t, writeConfig(t, map[string]string{"it.yaml": basicConfig}))
	if !strings.Contains(p.stderr.String(), "starting ratelimit") || !strings.Contains(p.stderr.String(), "version="+fields[1]) {
		t.Errorf("the start-up log does not name version %s:\n%s", fields[1], p.stderr)
	}
	if m := metricsBody(t, p); !strings.Contains(m, `ratelimit_build_info{goversion="`+fields[len(fields)-1]+`"`) ||
		!strings.Contains(m, `version="`+fields[1]+`"} 1`) {
		t.Errorf("/metrics lacks ratelimit_build_info for %q", version)
	}
}

// TestHelpAndExampleSayWhatIsRead: -h says that every file of the config
// directory is read, as the loader does (a file without a .yaml name
// serves its limits); and the shipped example config, on the embedded
// store as make run serves it, starts without a warning.
func TestHelpAndExampleSayWhatIsRead(t *testing.T) {
	out, err := exec.Command(serverBin, "-h").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "every file in it") || strings.Contains(string(out), "*.yaml") {
		t.Errorf("-h: %v, %q; want it to say every file of the directory is read", err, out)
	}
	p := start(t, writeConfig(t, map[string]string{"limits": basicConfig}))
	if got := p.should(t, "it", configtest.Desc("user=a")).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 2 {
		t.Errorf("a config file named without .yaml: limit %d, want 2 (it is read)", got)
	}
	example, err := os.ReadFile("../examples/ratelimit-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	q := start(t, writeConfig(t, map[string]string{"ratelimit-config.yaml": string(example)}))
	q.should(t, "example", configtest.Desc("generic_key=demo"))
	for _, line := range strings.Split(q.stderr.String(), "\n") {
		if strings.Contains(line, "level=warn") || strings.Contains(line, "ignored") {
			t.Errorf("the example config on the embedded store logs: %s", line)
		}
	}
}

// TestNonConfigFilesAreNamedAtStartup: a notes file beside the config
// stops start-up with an error that says what it is and why it was read,
// as config-check says it.
func TestNonConfigFilesAreNamedAtStartup(t *testing.T) {
	env := writeConfig(t, map[string]string{"it.yaml": basicConfig, "NOTES.txt": "remember to raise the demo limit\n"})
	exitsSaying(t, env, "NOTES.txt: text, not a descriptor config: the service reads every file of its config directory")
}

// TestREADMESampleAnswers: the README's sample /json answer to its curl
// call is what the binary answers to that call on the example config, its
// JSON compared as values (protojson varies its spacing between builds)
// and the one figure that moves, durationUntilReset, as present.
func TestREADMESampleAnswers(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	body := regexp.MustCompile(`curl -s -XPOST localhost:8080/json \\\n  -d '([^']+)'`).FindSubmatch(readme)
	answer := regexp.MustCompile(`(?m)^# (\{"overallCode".*\})$`).FindSubmatch(readme)
	if body == nil || answer == nil {
		t.Fatal("the README's curl call or its sample answer is not where this test looks")
	}
	example, err := os.ReadFile("../examples/ratelimit-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, writeConfig(t, map[string]string{"ratelimit-config.yaml": string(example)}))
	resp, err := http.Post("http://"+p.httpAddr+"/json", "application/json", bytes.NewReader(body[1]))
	if err != nil {
		t.Fatal(err)
	}
	got := readBody(resp)
	norm := func(s string) any {
		var v map[string]any
		if err := json.Unmarshal([]byte(s), &v); err != nil {
			t.Fatalf("not JSON: %q: %v", s, err)
		}
		for _, st := range v["statuses"].([]any) {
			if m := st.(map[string]any); m["durationUntilReset"] != nil {
				m["durationUntilReset"] = "present"
			}
		}
		return v
	}
	if want := norm(string(answer[1])); !reflect.DeepEqual(norm(got), want) || resp.StatusCode != http.StatusOK {
		t.Errorf("the README's call answers %d %s\nwhere the README shows %s", resp.StatusCode, got, answer[1])
	}
}
