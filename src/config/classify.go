package config

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// What a file is, when it is plainly not a descriptor config: config-check
// names what it passes over in a directory of examples or manifests, and
// the service and config-check both say it of a file of the config
// directory that does not parse (NotAConfig). A file that looks like
// neither a descriptor config nor one of these is still parsed as a
// config (and its errors reported): a misspelled config must not pass as
// "not a config".

// topKeys lists the keys at the top level of every document of data (lines
// that start a mapping key at column 0), without decoding it: a 100,000-rule
// config takes most of a second to decode, and is decoded once, later.
func topKeys(data []byte) []string {
	var keys []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), len(data)+1)
	for sc.Scan() {
		if m := topKey.FindSubmatch(sc.Bytes()); m != nil && !slices.Contains(keys, string(m[1])) {
			keys = append(keys, string(m[1]))
		}
	}
	return keys
}

// jsonDoc is how a JSON object or array begins.
var jsonDoc = regexp.MustCompile(`^(\{\s*"|\[)`)

var topKey = regexp.MustCompile(`^["']?([A-Za-z_][A-Za-z0-9_.-]*)["']?[ \t]*:(?:[ \t]|$)`)

// envoyBootstrap are top-level fields of an Envoy bootstrap.
var envoyBootstrap = []string{"static_resources", "dynamic_resources", "admin", "node", "layered_runtime",
	"cluster_manager", "overload_manager", "stats_sinks", "tracing"}

// Classify says what data plainly is when it is not a descriptor config
// (an Envoy bootstrap, Kubernetes objects, a Compose file, Prometheus
// rules, JSON, a Grafana dashboard, text), or "" when it may be one. Kubernetes objects are decoded: their
// ConfigMaps' *.yaml and *.yml entries are descriptor configs to check,
// returned in configMaps (entry name → body), unless they are one of these
// themselves.
func Classify(data []byte) (what string, configMaps map[string]string) {
	keys := topKeys(data)
	has := func(k string) bool { return slices.Contains(keys, k) }
	trimmed := bytes.TrimSpace(data)
	switch {
	case jsonDoc.Match(trimmed) && !bytes.Contains(data, []byte(`"domain"`)):
		// JSON is YAML, and a descriptor config may be written in it: one
		// that names no domain is not one.
		if bytes.Contains(data, []byte(`"panels"`)) {
			return "a Grafana dashboard (JSON)", nil
		}
		return "JSON", nil
	case has("domain") || has("descriptors"):
		return "", nil
	case has("apiVersion") && has("kind"):
		return kubernetesObjects(data)
	case slices.ContainsFunc(envoyBootstrap, has):
		return "an Envoy bootstrap", nil
	case has("services"):
		return "a Docker Compose file", nil
	case has("groups"):
		return "Prometheus rules", nil
	case len(keys) == 0 && len(trimmed) > 0 && !bytes.HasPrefix(trimmed, []byte("---")) && !bytes.HasPrefix(trimmed, []byte("#")):
		return "text", nil
	}
	return "", nil
}

// NotAConfig is the error that says a file of the config directory that
// did not parse is plainly something else.
func NotAConfig(path, what string) error {
	return fmt.Errorf("%s: %s, not a descriptor config: the service reads every file of its config directory and refuses this one (move it out of the directory)",
		path, what)
}

// kubernetesObjects describes a manifest's objects and returns its
// ConfigMaps' config entries; what is "" if it holds no object, which is
// then checked as a config.
func kubernetesObjects(data []byte) (what string, configMaps map[string]string) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var kinds []string
	type cm struct {
		name    string
		entries map[string]string
	}
	var cms []cm
	for {
		var obj struct {
			Kind     string                `yaml:"kind"`
			Metadata struct{ Name string } `yaml:"metadata"`
			Data     map[string]string     `yaml:"data"`
		}
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil || obj.Kind == "" {
			return "", nil // not plainly Kubernetes: checked as a config, errors and all
		}
		if !slices.Contains(kinds, obj.Kind) {
			kinds = append(kinds, obj.Kind)
		}
		if obj.Kind == "ConfigMap" {
			cms = append(cms, cm{obj.Metadata.Name, obj.Data})
		}
	}
	if len(kinds) == 0 {
		return "", nil
	}
	configMaps = map[string]string{}
	for _, c := range cms {
		for name, body := range c.entries {
			if ext := filepath.Ext(name); ext != ".yaml" && ext != ".yml" {
				continue
			}
			if other, _ := Classify([]byte(body)); other != "" {
				continue // an Envoy bootstrap mounted beside the configs, say
			}
			key := name
			if _, dup := configMaps[key]; dup || len(cms) > 1 {
				key = c.name + "/" + name
			}
			configMaps[key] = body
		}
	}
	return "Kubernetes objects (" + strings.Join(kinds, ", ") + ")", configMaps
}
