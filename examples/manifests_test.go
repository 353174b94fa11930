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

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/settings"
)

// manifests holds one directory's objects, decoded strictly into the
// Kubernetes API types.
type manifests struct {
	deployments []*appsv1.Deployment
	services    []*corev1.Service
	configMaps  map[string]*corev1.ConfigMap
	pdbs        []*policyv1.PodDisruptionBudget
}

func splitDocs(data []byte) [][]byte {
	var out [][]byte
	for _, d := range bytes.Split(data, []byte("\n---\n")) {
		if len(bytes.TrimSpace(d)) > 0 {
			out = append(out, d)
		}
	}
	return out
}

func loadManifests(t *testing.T, dir string) *manifests {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", dir, err)
	}
	m := &manifests{configMaps: map[string]*corev1.ConfigMap{}}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range splitDocs(data) {
			var head struct{ APIVersion, Kind string }
			if err := yaml.Unmarshal(doc, &head); err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			var obj any
			switch head.APIVersion + " " + head.Kind {
			case "apps/v1 Deployment":
				d := &appsv1.Deployment{}
				m.deployments, obj = append(m.deployments, d), d
			case "v1 Service":
				s := &corev1.Service{}
				m.services, obj = append(m.services, s), s
			case "v1 ConfigMap":
				obj = &corev1.ConfigMap{}
			case "policy/v1 PodDisruptionBudget":
				p := &policyv1.PodDisruptionBudget{}
				m.pdbs, obj = append(m.pdbs, p), p
			default:
				t.Fatalf("%s document %d: unexpected %s %s", f, i, head.APIVersion, head.Kind)
			}
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				t.Fatalf("%s document %d (%s): %v", f, i, head.Kind, err)
			}
			if cm, ok := obj.(*corev1.ConfigMap); ok {
				m.configMaps[cm.Name] = cm
			}
		}
	}
	return m
}

func TestKubernetesManifests(t *testing.T) {
	known := settings.Names()
	for _, dir := range []string{"kubernetes/shared", "kubernetes/sidecar"} {
		t.Run(dir, func(t *testing.T) {
			m := loadManifests(t, dir)
			if len(m.pdbs) == 0 {
				t.Error("no PodDisruptionBudget")
			}
			var rl *corev1.Container
			var pod *corev1.PodSpec
			for _, d := range m.deployments {
				for i := range d.Spec.Template.Spec.Containers {
					c := &d.Spec.Template.Spec.Containers[i]
					if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
						t.Errorf("deployment %s container %s has no CPU and memory requests", d.Name, c.Name)
					}
					if c.Name == "ratelimit" {
						rl, pod = c, &d.Spec.Template.Spec
					}
				}
				if !selects(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
					t.Errorf("deployment %s's selector does not select its pods", d.Name)
				}
			}
			if rl == nil {
				t.Fatal("no ratelimit container")
			}
			for _, p := range []*corev1.Probe{rl.ReadinessProbe, rl.LivenessProbe} {
				if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthcheck" {
					t.Errorf("ratelimit container lacks a /healthcheck readiness or liveness probe")
				}
			}
			checkImageUser(t, imageUser(t, "../Dockerfile"), rl, pod)
			if len(rl.Command) > 0 && !slices.Equal(rl.Command, []string{"/bin/ratelimit"}) {
				t.Errorf("ratelimit container command %q: the image's server is /bin/ratelimit", rl.Command)
			}
			env := map[string]string{}
			for _, e := range rl.Env {
				if !slices.Contains(known, e.Name) {
					t.Errorf("env %s is not a setting of the service", e.Name)
				}
				env[e.Name] = e.Value
			}
			// The debug port listens on loopback unless DEBUG_HOST says
			// otherwise: exposing it in the pod would promise what it is not.
			for _, port := range rl.Ports {
				if port.ContainerPort == 6070 && (env["DEBUG_HOST"] == "" || env["DEBUG_HOST"] == "127.0.0.1") {
					t.Errorf("container port 6070 is declared, but the debug port listens on loopback (set DEBUG_HOST)")
				}
			}
			want := path.Join(env["RUNTIME_ROOT"], env["RUNTIME_SUBDIRECTORY"], env["RUNTIME_APPDIRECTORY"])
			checkConfigMount(t, m, rl, pod, want)
		})
	}
}

// imageUser returns the numeric user of the Dockerfile's last USER line
// (the final stage's), failing if it is a name: the kubelet cannot check a
// name against runAsNonRoot and refuses to start such a pod.
func imageUser(t *testing.T, dockerfile string) int64 {
	t.Helper()
	data, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	user := ""
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 2 && strings.EqualFold(f[0], "USER") {
			user = f[1]
		}
	}
	if user == "" {
		t.Fatalf("%s has no USER line: the image would run as root", dockerfile)
	}
	uid, _, _ := strings.Cut(user, ":")
	n, err := strconv.ParseInt(uid, 10, 64)
	if err != nil {
		t.Fatalf("%s: USER %s is not numeric; pods with runAsNonRoot cannot start it", dockerfile, user)
	}
	if n == 0 {
		t.Fatalf("%s: USER %s is root", dockerfile, user)
	}
	return n
}

// checkImageUser checks that the pod runs the container as the image's
// user, and as non-root, the container's securityContext overriding the
// pod's as the kubelet does.
func checkImageUser(t *testing.T, uid int64, c *corev1.Container, pod *corev1.PodSpec) {
	t.Helper()
	var nonRoot *bool
	var runAs *int64
	if sc := pod.SecurityContext; sc != nil {
		nonRoot, runAs = sc.RunAsNonRoot, sc.RunAsUser
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsNonRoot != nil {
			nonRoot = sc.RunAsNonRoot
		}
		if sc.RunAsUser != nil {
			runAs = sc.RunAsUser
		}
	}
	if nonRoot == nil || !*nonRoot {
		t.Errorf("container %s: runAsNonRoot is not set", c.Name)
	}
	if runAs == nil {
		t.Errorf("container %s: no runAsUser; set it to the image's user %d", c.Name, uid)
	} else if *runAs != uid {
		t.Errorf("container %s: runAsUser %d, but the image's USER is %d", c.Name, *runAs, uid)
	}
}

func selects(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

// checkConfigMount checks that the config directory the env names is a
// ConfigMap mounted whole (subPath mounts never update) and that the config
// in it loads.
func checkConfigMount(t *testing.T, m *manifests, c *corev1.Container, pod *corev1.PodSpec, dir string) {
	t.Helper()
	for _, vm := range c.VolumeMounts {
		if vm.MountPath != dir {
			continue
		}
		if vm.SubPath != "" {
			t.Errorf("config mounted with subPath: Kubernetes never updates it, so edits would not reload")
		}
		for _, v := range pod.Volumes {
			if v.Name != vm.Name || v.ConfigMap == nil {
				continue
			}
			cm := m.configMaps[v.ConfigMap.Name]
			if cm == nil {
				t.Fatalf("ConfigMap %s is not defined", v.ConfigMap.Name)
			}
			configFrom(t, cm)
			return
		}
	}
	t.Errorf("no ConfigMap volume mounted at %s (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY)", dir)
}

// configFrom builds the rate limit config held in a ConfigMap.
func configFrom(t *testing.T, cm *corev1.ConfigMap) *config.Config {
	t.Helper()
	var files []*config.File
	for name, body := range cm.Data {
		f, err := config.Parse(cm.Name+"/"+name, []byte(body))
		if err != nil {
			t.Fatalf("config in ConfigMap: %v", err)
		}
		files = append(files, f)
	}
	c, err := config.Build(files, config.Options{})
	if err != nil {
		t.Fatalf("config in ConfigMap: %v", err)
	}
	return c
}

func TestSidecarEnvoyConfig(t *testing.T) {
	m := loadManifests(t, "kubernetes/sidecar")
	envoy := m.configMaps["app-envoy-config"]
	if envoy == nil {
		t.Fatal("no app-envoy-config ConfigMap")
	}
	checkBootstrap(t, loadBootstrap(t, "app-envoy-config", []byte(envoy.Data["envoy.yaml"])), configFrom(t, m.configMaps["app-ratelimit-config"]))
}

// TestIstioEnvoyFilter checks the EnvoyFilter's shape and decodes its
// patches into the Envoy types they patch.
func TestIstioEnvoyFilter(t *testing.T) {
	data, err := os.ReadFile("istio/envoyfilter.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ef struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name, Namespace string
		} `json:"metadata"`
		Spec struct {
			WorkloadSelector struct {
				Labels map[string]string `json:"labels"`
			} `json:"workloadSelector"`
			ConfigPatches []struct {
				ApplyTo string         `json:"applyTo"`
				Match   map[string]any `json:"match"`
				Patch   struct {
					Operation string         `json:"operation"`
					Value     map[string]any `json:"value"`
				} `json:"patch"`
			} `json:"configPatches"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(data, &ef); err != nil {
		t.Fatalf("envoyfilter.yaml: %v", err)
	}
	if ef.APIVersion != "networking.istio.io/v1alpha3" || ef.Kind != "EnvoyFilter" || ef.Metadata.Name == "" {
		t.Fatalf("not an EnvoyFilter: %s %s %q", ef.APIVersion, ef.Kind, ef.Metadata.Name)
	}
	if ef.Spec.WorkloadSelector.Labels["istio"] != "ingressgateway" {
		t.Errorf("workloadSelector = %v, want the ingress gateway", ef.Spec.WorkloadSelector.Labels)
	}
	cfg := configFrom(t, loadManifests(t, "kubernetes/shared").configMaps["ratelimit-config"])
	var domain string
	var vhost routev3.VirtualHost
	for i, p := range ef.Spec.ConfigPatches {
		js, err := yaml.Marshal(p.Patch.Value)
		if err == nil {
			js, err = yaml.YAMLToJSON(js)
		}
		if err != nil {
			t.Fatal(err)
		}
		switch p.ApplyTo {
		case "HTTP_FILTER":
			f := &hcmv3.HttpFilter{}
			if err := protojson.Unmarshal(js, f); err != nil {
				t.Fatalf("patch %d is not an HttpFilter: %v", i, err)
			}
			rl := &ratelimitfilterv3.RateLimit{}
			if err := f.GetTypedConfig().UnmarshalTo(rl); err != nil || rl.ValidateAll() != nil {
				t.Fatalf("patch %d: not a valid rate limit filter: %v", i, err)
			}
			if c := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName(); !strings.Contains(c, "|8081||ratelimit.") {
				t.Errorf("patch %d: cluster %q is not the shared service's gRPC port", i, c)
			}
			domain = rl.GetDomain()
		case "VIRTUAL_HOST":
			if err := protojson.Unmarshal(js, &vhost); err != nil {
				t.Fatalf("patch %d is not a VirtualHost fragment: %v", i, err)
			}
		default:
			t.Fatalf("patch %d: unexpected applyTo %s", i, p.ApplyTo)
		}
	}
	d := cfg.Domain(domain)
	if d == nil {
		t.Fatalf("the filter's domain %q is not in the shared ConfigMap", domain)
	}
	checkActions(t, routeRateLimits([]*routev3.VirtualHost{&vhost}), d)
}
