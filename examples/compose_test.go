package examples

import (
	"bytes"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/settings"
)

// composeFile is the part of the Compose format the example uses; decoding
// is strict, so a misspelt key fails.
type composeFile struct {
	Services map[string]struct {
		Image string `yaml:"image"`
		Build struct {
			Context string `yaml:"context"`
		} `yaml:"build"`
		Command     []string          `yaml:"command"`
		DependsOn   []string          `yaml:"depends_on"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		Ports       []string          `yaml:"ports"`
	} `yaml:"services"`
}

// TestComposeExample checks examples/compose: every service builds or has
// an image, the rate limit service's settings exist and its config mount
// lands where RUNTIME_* points, and the Envoy config it mounts is the
// validated examples/envoy.yaml, whose clusters name the compose services
// on the ports they listen on.
func TestComposeExample(t *testing.T) {
	const dir = "compose"
	data, err := os.ReadFile(filepath.Join(dir, "docker-compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("docker-compose.yaml: %v", err)
	}
	for _, name := range []string{"redis", "ratelimit", "envoy", "app"} {
		if _, ok := c.Services[name]; !ok {
			t.Fatalf("docker-compose.yaml has no %s service", name)
		}
	}
	for name, s := range c.Services {
		if (s.Image == "") == (s.Build.Context == "") {
			t.Errorf("service %s needs an image or a build context, not both", name)
		}
		if s.Build.Context != "" {
			if _, err := os.Stat(filepath.Join(dir, s.Build.Context, "Dockerfile")); err != nil {
				t.Errorf("service %s builds %s, which has no Dockerfile", name, s.Build.Context)
			}
		}
		for _, dep := range s.DependsOn {
			if _, ok := c.Services[dep]; !ok {
				t.Errorf("service %s depends on unknown service %s", name, dep)
			}
		}
	}
	mounts := func(name string) map[string]string { // container path → host file
		out := map[string]string{}
		for _, v := range c.Services[name].Volumes {
			parts := strings.Split(v, ":")
			if len(parts) < 2 {
				t.Fatalf("service %s: volume %q is not host:container", name, v)
			}
			host := filepath.Join(dir, parts[0])
			if _, err := os.Stat(host); err != nil {
				t.Errorf("service %s mounts %s, which does not exist", name, parts[0])
			}
			out[parts[1]] = host
		}
		return out
	}

	rl := c.Services["ratelimit"]
	if len(rl.Command) > 0 && !slices.Equal(rl.Command, []string{"/bin/ratelimit"}) {
		t.Errorf("ratelimit: command %q, but the image's server is /bin/ratelimit", rl.Command)
	}
	known := settings.Names()
	for k := range rl.Environment {
		if !slices.Contains(known, k) {
			t.Errorf("ratelimit: %s is not a setting of the service", k)
		}
	}
	if host, _, _ := strings.Cut(rl.Environment["REDIS_URL"], ":"); c.Services[host].Image == "" {
		t.Errorf("ratelimit: REDIS_URL %q does not name the redis service", rl.Environment["REDIS_URL"])
	}
	cfgDir := path.Join(rl.Environment["RUNTIME_ROOT"], rl.Environment["RUNTIME_SUBDIRECTORY"], rl.Environment["RUNTIME_APPDIRECTORY"])
	var cfgFiles []string
	for target, host := range mounts("ratelimit") {
		if path.Dir(target) == cfgDir {
			cfgFiles = append(cfgFiles, host)
		}
	}
	if len(cfgFiles) == 0 {
		t.Fatalf("ratelimit: nothing is mounted in the config directory %s", cfgDir)
	}
	cfg, err := config.LoadFiles(cfgFiles, config.Options{})
	if err != nil {
		t.Fatalf("ratelimit's mounted config: %v", err)
	}

	envoy := c.Services["envoy"]
	i := slices.Index(envoy.Command, "-c")
	if i < 0 || i+1 >= len(envoy.Command) {
		t.Fatalf("envoy: no -c in its command %q", envoy.Command)
	}
	bootstrapFile, ok := mounts("envoy")[envoy.Command[i+1]]
	if !ok {
		t.Fatalf("envoy: its config %s is not mounted", envoy.Command[i+1])
	}
	bootstrapData, err := os.ReadFile(bootstrapFile)
	if err != nil {
		t.Fatal(err)
	}
	b := loadBootstrap(t, bootstrapFile, bootstrapData)
	checkBootstrap(t, b, cfg)
	grpcPort := uint32(8081)
	if p, err := strconv.Atoi(rl.Environment["GRPC_PORT"]); err == nil {
		grpcPort = uint32(p)
	}
	for _, cl := range b.GetStaticResources().GetClusters() {
		for _, eps := range cl.GetLoadAssignment().GetEndpoints() {
			for _, ep := range eps.GetLbEndpoints() {
				sa := ep.GetEndpoint().GetAddress().GetSocketAddress()
				if _, ok := c.Services[sa.GetAddress()]; !ok {
					t.Errorf("envoy cluster %s points at %s, which is not a compose service", cl.GetName(), sa.GetAddress())
				}
				if sa.GetAddress() == "ratelimit" && sa.GetPortValue() != grpcPort {
					t.Errorf("envoy cluster %s reaches ratelimit on port %d, but it serves gRPC on %d", cl.GetName(), sa.GetPortValue(), grpcPort)
				}
				if sa.GetAddress() == "app" && !slices.Contains(c.Services["app"].Command, "-listen=:"+strconv.Itoa(int(sa.GetPortValue()))) {
					t.Errorf("envoy cluster %s reaches app on port %d, which app does not listen on (%q)", cl.GetName(), sa.GetPortValue(), c.Services["app"].Command)
				}
			}
		}
	}
}

// TestDockerignore: the image's build context leaves out history, local
// builds and run state (they would bloat the context and could leak into a
// layer), but keeps what the Dockerfile copies.
func TestDockerignore(t *testing.T) {
	data, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatalf(".dockerignore: %v", err)
	}
	var patterns []string
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			patterns = append(patterns, l)
		}
	}
	for _, want := range []string{".git", "bin", ".run"} {
		if !slices.Contains(patterns, want) {
			t.Errorf(".dockerignore does not leave out %s", want)
		}
	}
	for _, keep := range []string{"go.mod", "go.sum", "cmd", "src", "examples", "examples/ratelimit-config.yaml"} {
		for _, p := range patterns {
			if ok, _ := filepath.Match(p, keep); ok || p == keep || p == "*" {
				t.Errorf(".dockerignore pattern %q leaves out %s, which the Dockerfile needs", p, keep)
			}
		}
	}
}
