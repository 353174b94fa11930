package examples

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// dockerStage is one FROM ... stage of a Dockerfile: its name and its
// instructions, continuation lines joined.
type dockerStage struct {
	name  string
	instr []string
}

func dockerStages(t *testing.T, path string) []dockerStage {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var stages []dockerStage
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		f := strings.Fields(line)
		if strings.EqualFold(f[0], "FROM") {
			st := dockerStage{}
			if len(f) == 4 && strings.EqualFold(f[2], "AS") {
				st.name = f[3]
			}
			stages = append(stages, st)
			return
		}
		if len(stages) == 0 {
			t.Fatalf("%s: %q before the first FROM", path, line)
		}
		stages[len(stages)-1].instr = append(stages[len(stages)-1].instr, line)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if s, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(line)
		flush()
	}
	flush()
	return stages
}

// TestDockerfileServerPath: the image must run where envoyproxy/ratelimit's
// runs. Envoy Gateway's generated Deployment, Istio's sample and most Helm
// charts set command: [/bin/ratelimit], which replaces the entrypoint; the
// final image has no shell to make a link at run time. So the build stage
// must build the server to bin/ratelimit, the final stage copy it to /bin/,
// and the entrypoint be that path; the older /usr/local/bin/server stays.
func TestDockerfileServerPath(t *testing.T) {
	stages := dockerStages(t, "../Dockerfile")
	if len(stages) < 2 {
		t.Fatalf("want a build stage and a final stage, got %d stages", len(stages))
	}
	build, final := stages[0], stages[len(stages)-1]
	buildsServer := regexp.MustCompile(`go build .*-o (\S+)/bin/ratelimit \./cmd/server\b`)
	links := regexp.MustCompile(`ln -s /bin/ratelimit (\S+)/usr/local/bin/server\b`)
	out, linked := "", false
	for _, in := range build.instr {
		if m := buildsServer.FindStringSubmatch(in); m != nil {
			out = m[1]
		}
		if m := links.FindStringSubmatch(in); m != nil && m[1] == out {
			linked = true
		}
	}
	if out == "" {
		t.Fatal("the build stage does not build ./cmd/server to .../bin/ratelimit")
	}
	if !linked {
		t.Errorf("the build stage does not link %s/usr/local/bin/server to /bin/ratelimit", out)
	}
	copies := map[string]bool{}
	var entry []string
	for _, in := range final.instr {
		f := strings.Fields(in)
		switch strings.ToUpper(f[0]) {
		case "COPY":
			if len(f) == 4 && f[1] == "--from="+build.name {
				copies[f[2]+" "+f[3]] = true
			}
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(strings.TrimSpace(in[len(f[0]):])), &entry); err != nil {
				t.Fatalf("ENTRYPOINT is not in exec form: %v", err)
			}
		}
	}
	for _, want := range []string{out + "/bin/ /bin/", out + "/usr/local/bin/ /usr/local/bin/"} {
		if !copies[want] {
			t.Errorf("the final stage lacks COPY --from=%s %s", build.name, want)
		}
	}
	if len(entry) != 1 || entry[0] != "/bin/ratelimit" {
		t.Errorf("ENTRYPOINT %q, want [\"/bin/ratelimit\"]", entry)
	}
}

// TestEnvoyGatewayExample checks the Envoy Gateway page's configuration
// strictly against the fields it uses of Envoy Gateway's EnvoyGateway API
// (v1alpha1): an unknown or misspelt field is an error, and the rate limit
// Deployment's image must be set.
func TestEnvoyGatewayExample(t *testing.T) {
	data, err := os.ReadFile("envoy-gateway/envoy-gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var eg struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Gateway    struct {
			ControllerName string `json:"controllerName"`
		} `json:"gateway"`
		Provider struct {
			Type       string `json:"type"`
			Kubernetes struct {
				RateLimitDeployment struct {
					Container struct {
						Image string `json:"image"`
					} `json:"container"`
				} `json:"rateLimitDeployment"`
			} `json:"kubernetes"`
		} `json:"provider"`
		RateLimit struct {
			Backend struct {
				Type  string `json:"type"`
				Redis struct {
					URL string `json:"url"`
				} `json:"redis"`
			} `json:"backend"`
		} `json:"rateLimit"`
	}
	if err := yaml.UnmarshalStrict(data, &eg); err != nil {
		t.Fatal(err)
	}
	if eg.APIVersion != "gateway.envoyproxy.io/v1alpha1" || eg.Kind != "EnvoyGateway" {
		t.Errorf("apiVersion/kind %s/%s", eg.APIVersion, eg.Kind)
	}
	if eg.Provider.Type != "Kubernetes" || eg.Provider.Kubernetes.RateLimitDeployment.Container.Image == "" {
		t.Error("provider.kubernetes.rateLimitDeployment.container.image is not set")
	}
	if eg.RateLimit.Backend.Type != "Redis" || eg.RateLimit.Backend.Redis.URL == "" {
		t.Error("rateLimit.backend is not Redis with a URL: Envoy Gateway deploys no rate limit service without it")
	}
	readme, err := os.ReadFile("envoy-gateway/README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), eg.Provider.Kubernetes.RateLimitDeployment.Container.Image) {
		t.Error("the README's snippet does not show the image the example sets")
	}
}
