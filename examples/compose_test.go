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

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	"google.golang.org/protobuf/proto"
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

// TestComposeExample checks examples/compose/docker-compose.yaml: every
// service builds or has an image, the rate limit service's settings exist
// and its config mount lands where RUNTIME_* points, and the Envoy config
// it mounts is the validated examples/envoy.yaml, whose clusters name the
// compose services on the ports they listen on.
func TestComposeExample(t *testing.T) {
	c := readCompose(t, "docker-compose.yaml", "redis", "ratelimit", "envoy", "app")
	rl := c.Services["ratelimit"]
	if host, _, _ := strings.Cut(rl.Environment["REDIS_URL"], ":"); c.Services[host].Image == "" {
		t.Errorf("ratelimit: REDIS_URL %q does not name the redis service", rl.Environment["REDIS_URL"])
	}
	cfg := c.ratelimitConfig(t)
	b := c.envoyBootstrap(t, "envoy")
	checkBootstrap(t, b, cfg)
	c.checkClusters(t, b)
}

// TestComposeRLQSExample checks examples/compose/docker-compose-rlqs.yaml
// as TestComposeExample does the other, for the RLQS quick start of
// docs/rlqs.md: two Envoys on examples/envoy-rlqs.yaml (validated by
// TestEnvoyRLQSExample) beside the service on its embedded store, whose
// mounted config holds the filter's domain.
func TestComposeRLQSExample(t *testing.T) {
	c := readCompose(t, "docker-compose-rlqs.yaml", "ratelimit", "app", "envoy-a", "envoy-b")
	rl := c.Services["ratelimit"]
	if rl.Environment["BACKEND_TYPE"] != "memory" || rl.Environment["REDIS_URL"] != "" {
		t.Errorf("ratelimit: the quick start runs on the embedded store, got BACKEND_TYPE=%q REDIS_URL=%q", rl.Environment["BACKEND_TYPE"], rl.Environment["REDIS_URL"])
	}
	cfg := c.ratelimitConfig(t)
	example, _ := loadExample(t, "envoy-rlqs.yaml", "rlqs-ratelimit-config.yaml")
	for _, name := range []string{"envoy-a", "envoy-b"} {
		b := c.envoyBootstrap(t, name)
		if !proto.Equal(b, example) {
			t.Errorf("%s does not run examples/envoy-rlqs.yaml", name)
		}
		c.checkClusters(t, b)
	}
	for _, h := range connectionManagers(example) {
		for _, f := range h.GetHttpFilters() {
			q := &rlqsfilterv3.RateLimitQuotaFilterConfig{}
			if f.GetTypedConfig().UnmarshalTo(q) == nil && cfg.Domain(q.GetDomain()) == nil {
				t.Errorf("the filter's domain %q is not in the service's mounted config", q.GetDomain())
			}
		}
	}
}

// compose is one example compose file, decoded.
type compose struct {
	composeFile
	dir string
}

// readCompose decodes examples/compose/name strictly and checks that it
// has the services named, that each builds or has an image, and that
// what they depend on exists.
func readCompose(t *testing.T, name string, services ...string) *compose {
	t.Helper()
	c := &compose{dir: "compose"}
	data, err := os.ReadFile(filepath.Join(c.dir, name))
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c.composeFile); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	for _, s := range services {
		if _, ok := c.Services[s]; !ok {
			t.Fatalf("%s has no %s service", name, s)
		}
	}
	for name, s := range c.Services {
		if (s.Image == "") == (s.Build.Context == "") {
			t.Errorf("service %s needs an image or a build context, not both", name)
		}
		if s.Build.Context != "" {
			if _, err := os.Stat(filepath.Join(c.dir, s.Build.Context, "Dockerfile")); err != nil {
				t.Errorf("service %s builds %s, which has no Dockerfile", name, s.Build.Context)
			}
		}
		for _, dep := range s.DependsOn {
			if _, ok := c.Services[dep]; !ok {
				t.Errorf("service %s depends on unknown service %s", name, dep)
			}
		}
	}
	return c
}

// mounts is a service's volumes: container path → host file, each of
// which must exist.
func (c *compose) mounts(t *testing.T, name string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, v := range c.Services[name].Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 {
			t.Fatalf("service %s: volume %q is not host:container", name, v)
		}
		host := filepath.Join(c.dir, parts[0])
		if _, err := os.Stat(host); err != nil {
			t.Errorf("service %s mounts %s, which does not exist", name, parts[0])
		}
		out[parts[1]] = host
	}
	return out
}

// ratelimitConfig checks the ratelimit service's command and settings and
// loads the descriptor config mounted where its RUNTIME_* settings point.
func (c *compose) ratelimitConfig(t *testing.T) *config.Config {
	t.Helper()
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
	cfgDir := path.Join(rl.Environment["RUNTIME_ROOT"], rl.Environment["RUNTIME_SUBDIRECTORY"], rl.Environment["RUNTIME_APPDIRECTORY"])
	var cfgFiles []string
	for target, host := range c.mounts(t, "ratelimit") {
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
	return cfg
}

// envoyBootstrap loads and validates the bootstrap an Envoy service
// mounts where its -c points.
func (c *compose) envoyBootstrap(t *testing.T, name string) *bootstrapv3.Bootstrap {
	t.Helper()
	envoy := c.Services[name]
	i := slices.Index(envoy.Command, "-c")
	if i < 0 || i+1 >= len(envoy.Command) {
		t.Fatalf("%s: no -c in its command %q", name, envoy.Command)
	}
	file, ok := c.mounts(t, name)[envoy.Command[i+1]]
	if !ok {
		t.Fatalf("%s: its config %s is not mounted", name, envoy.Command[i+1])
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return loadBootstrap(t, file, data)
}

// checkClusters checks that b's clusters name compose services, on the
// ports those listen on.
func (c *compose) checkClusters(t *testing.T, b *bootstrapv3.Bootstrap) {
	t.Helper()
	grpcPort := uint32(8081)
	if p, err := strconv.Atoi(c.Services["ratelimit"].Environment["GRPC_PORT"]); err == nil {
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
