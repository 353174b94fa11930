package settings

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/xds"
)

// ConfigSource is where the descriptor config comes from (files or xDS)
// and how it is read.
type ConfigSource struct {
	// Config files: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY/*.yaml.
	RuntimeRoot           string `envconfig:"RUNTIME_ROOT" default:"/srv/runtime_data/current"`
	RuntimeSubdirectory   string `envconfig:"RUNTIME_SUBDIRECTORY"`
	RuntimeAppDirectory   string `envconfig:"RUNTIME_APPDIRECTORY" default:"config"`
	RuntimeIgnoreDotFiles bool   `envconfig:"RUNTIME_IGNOREDOTFILES" default:"false"`
	MergeDomainConfig     bool   `envconfig:"MERGE_DOMAIN_CONFIG" default:"false"`
	// WildcardPrecedence picks among wildcard values of one key that all
	// match: "first" in the config (as the reference) or "most_literal".
	WildcardPrecedence string `envconfig:"WILDCARD_PRECEDENCE" default:"first"`
	// RejectedHits is what a fixed_window limit does with a hit it rejects
	// when its descriptor has no rejected_hits: "count" it, as the reference
	// does (usage reported after the response then holds a tenant back), or
	// "drop" it (exact: a rejected hit consumes nothing).
	RejectedHits string `envconfig:"REJECTED_HITS" default:"count"`
	// RuntimeWatchRoot also watches RUNTIME_ROOT's parent, so that swapping
	// the root symlink reloads the config.
	RuntimeWatchRoot bool `envconfig:"RUNTIME_WATCH_ROOT" default:"true"`
	// ForceStartWithoutInitialConfig starts serving even when the config
	// cannot be loaded; requests then get Unavailable.
	ForceStartWithoutInitialConfig bool `envconfig:"FORCE_START_WITHOUT_INITIAL_CONFIG" default:"false"`
	// HealthyWithAtLeastOneConfigLoaded keeps /healthcheck failing until a
	// config with at least one domain is being served.
	HealthyWithAtLeastOneConfigLoaded bool `envconfig:"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED" default:"false"`

	// ConfigType is FILE or GRPC_XDS_SOTW.
	ConfigType              string        `envconfig:"CONFIG_TYPE" default:"FILE"`
	XDSServerURL            string        `envconfig:"CONFIG_GRPC_XDS_SERVER_URL" default:"localhost:18000"`
	XDSNodeID               string        `envconfig:"CONFIG_GRPC_XDS_NODE_ID" default:"default"`
	XDSConnectRetryInterval time.Duration `envconfig:"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL" default:"3s"`
	// XDSNodeMetadata is the node's metadata, "k1:v1,k2=v2" (either
	// separator, as the reference reads it).
	XDSNodeMetadata string `envconfig:"CONFIG_GRPC_XDS_NODE_METADATA"`
	// XDSAdditionalHeaders are gRPC metadata sent on the xDS stream,
	// "k1:v1,k2:v2".
	XDSAdditionalHeaders string `envconfig:"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"`
	// The xDS stream's reconnect backoff: the first wait, the most, the
	// random share of each wait (0.5: up to half either way), and whether to randomise.
	XDSBackoffInitial      time.Duration `envconfig:"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL" default:"10s"`
	XDSBackoffMax          time.Duration `envconfig:"XDS_CLIENT_BACKOFF_MAX_INTERVAL" default:"60s"`
	XDSBackoffRandomFactor float64       `envconfig:"XDS_CLIENT_BACKOFF_RANDOM_FACTOR" default:"0.5"`
	XDSBackoffJitter       bool          `envconfig:"XDS_CLIENT_BACKOFF_JITTER" default:"true"`
	// XDSMaxMsgSize bounds one xDS response (0: gRPC's 4 MiB).
	XDSMaxMsgSize int `envconfig:"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES" default:"0"`
	// TLS to the xDS server: CA of its certificate, optional client
	// certificate, optional name to verify instead of the URL's host.
	XDSServerUseTLS  bool   `envconfig:"CONFIG_GRPC_XDS_SERVER_USE_TLS" default:"false"`
	XDSServerTLSCA   string `envconfig:"CONFIG_GRPC_XDS_SERVER_TLS_CACERT"`
	XDSClientTLSCert string `envconfig:"CONFIG_GRPC_XDS_CLIENT_TLS_CERT"`
	XDSClientTLSKey  string `envconfig:"CONFIG_GRPC_XDS_CLIENT_TLS_KEY"`
	XDSServerTLSSAN  string `envconfig:"CONFIG_GRPC_XDS_SERVER_TLS_SAN"`
}

// ConfigDir is where the config files live.
func (s Settings) ConfigDir() string {
	return joinPath(s.RuntimeRoot, s.RuntimeSubdirectory, s.RuntimeAppDirectory)
}

// ConfigLoadError is what start-up says when the first load from
// ConfigDir failed with err: when the directory does not exist, which
// settings name it and how (the common mistake of a RUNTIME_ROOT that
// already ends in the app directory pointed out).
func (s Settings) ConfigLoadError(err error) error {
	dir := s.ConfigDir()
	if _, statErr := os.Stat(dir); !errors.Is(statErr, fs.ErrNotExist) {
		return fmt.Errorf("load config from %s: %w", dir, err)
	}
	hint := ""
	if app := s.RuntimeAppDirectory; app != "" && filepath.Base(filepath.Clean(s.RuntimeRoot)) == app {
		hint = fmt.Sprintf(" (RUNTIME_ROOT already ends in %q, which RUNTIME_APPDIRECTORY appends again: "+
			"set RUNTIME_ROOT to its parent)", app)
	}
	return fmt.Errorf("the config directory %s does not exist: it is RUNTIME_ROOT (%q), RUNTIME_SUBDIRECTORY (%q) and "+
		"RUNTIME_APPDIRECTORY (%q) joined; set them so that it names the directory of the YAML files%s, "+
		"or FORCE_START_WITHOUT_INITIAL_CONFIG=true to start without a config",
		dir, s.RuntimeRoot, s.RuntimeSubdirectory, s.RuntimeAppDirectory, hint)
}

func joinPath(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, strings.TrimSuffix(p, "/"))
		}
	}
	return strings.Join(out, "/")
}

// validateConfigSource checks CONFIG_TYPE and the xDS client.
func (s Settings) validateConfigSource(bad complaint) {
	switch strings.ToUpper(s.ConfigType) {
	case "FILE", "GRPC_XDS_SOTW":
	default:
		bad("CONFIG_TYPE", "unknown type %q (want FILE or GRPC_XDS_SOTW)", s.ConfigType)
	}
	if _, err := config.ParseWildcardPrecedence(s.WildcardPrecedence); err != nil {
		bad("WILDCARD_PRECEDENCE", "%v", err)
	}
	if _, err := config.ParseRejectedHits(s.RejectedHits); err != nil {
		bad("REJECTED_HITS", "%v", err)
	}
	if (s.XDSClientTLSCert == "") != (s.XDSClientTLSKey == "") {
		bad("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "and CONFIG_GRPC_XDS_CLIENT_TLS_KEY must be set together")
	}
	if s.XDSConnectRetryInterval <= 0 {
		bad("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "must be positive, got %v", s.XDSConnectRetryInterval)
	}
	if s.XDSBackoffInitial <= 0 {
		bad("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "must be positive, got %v", s.XDSBackoffInitial)
	}
	if s.XDSBackoffMax < s.XDSBackoffInitial {
		bad("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "must be at least XDS_CLIENT_BACKOFF_INITIAL_INTERVAL (%v), got %v", s.XDSBackoffInitial, s.XDSBackoffMax)
	}
	if s.XDSBackoffRandomFactor < 0 || s.XDSBackoffRandomFactor > 1 {
		bad("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "must be in [0, 1], got %v", s.XDSBackoffRandomFactor)
	}
	if s.XDSMaxMsgSize < 0 {
		bad("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "must not be negative, got %d", s.XDSMaxMsgSize)
	}
	if _, err := pairs(s.XDSNodeMetadata, ":="); err != nil {
		bad("CONFIG_GRPC_XDS_NODE_METADATA", "%v (want k1:v1,k2:v2)", err)
	}
	if _, err := pairs(s.XDSAdditionalHeaders, ":"); err != nil {
		bad("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "%v (want k1:v1,k2:v2)", err)
	}
}

// pairs parses "k1:v1,k2:v2" (EXTRA_TAGS, xDS headers and metadata; seps
// are the separators a pair may use between key and value).
func pairs(s, seps string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		i := strings.IndexAny(kv, seps)
		if i <= 0 {
			return nil, fmt.Errorf("%q is not key:value", kv)
		}
		out[strings.TrimSpace(kv[:i])] = strings.TrimSpace(kv[i+1:])
	}
	return out, nil
}

// XDSMetadata returns CONFIG_GRPC_XDS_NODE_METADATA as a map (validated by
// Load); the reference takes "k:v" and "k=v" alike.
func (c ConfigSource) XDSMetadata() map[string]string {
	m, _ := pairs(c.XDSNodeMetadata, ":=")
	return m
}

// XDSHeaders returns CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS as a map
// (validated by Load).
func (c ConfigSource) XDSHeaders() map[string]string {
	m, _ := pairs(c.XDSAdditionalHeaders, ":")
	return m
}

// ConfigOptions is how descriptor configs are built; cmd/server adds what
// a skipped entry does.
func (s Settings) ConfigOptions() config.Options {
	wildcards, _ := config.ParseWildcardPrecedence(s.WildcardPrecedence) // validated by Load
	rejected, _ := config.ParseRejectedHits(s.RejectedHits)              // validated by Load
	o := config.Options{MergeDomains: s.MergeDomainConfig, HashValues: s.CacheKeyHashValues, MaxDepth: s.RequestMaxEntries,
		Wildcards: wildcards, RejectedHits: rejected}
	switch s.Backend() {
	case "memory":
		o.IgnoresLease = "the embedded store (BACKEND_TYPE=memory) counts every hit exactly in this process; only the Redis store leases"
	case "memcache":
		o.IgnoresLease = "BACKEND_TYPE=memcache counts every hit in memcached; only the Redis store leases"
	case "redis":
		if s.LeaseInterval == 0 {
			o.IgnoresLease = "LEASE_INTERVAL=0 turns leasing off"
		}
	}
	return o
}

// XDSOptions is the xDS subscription, its TLS files loaded when set;
// cmd/server adds what a config is built with and installed by.
func (c ConfigSource) XDSOptions() (xds.Options, error) {
	xo := xds.Options{ServerURL: c.XDSServerURL, NodeID: c.XDSNodeID, RetryInterval: c.XDSConnectRetryInterval,
		Backoff: xds.Backoff{Initial: c.XDSBackoffInitial, Max: c.XDSBackoffMax, RandomFactor: c.XDSBackoffRandomFactor,
			Jitter: c.XDSBackoffJitter},
		NodeMetadata: c.XDSMetadata(), Headers: c.XDSHeaders(), MaxMsgSize: c.XDSMaxMsgSize}
	if c.XDSServerUseTLS {
		dial, err := xds.TLSDialOption(xds.TLSOptions{CAFile: c.XDSServerTLSCA, CertFile: c.XDSClientTLSCert,
			KeyFile: c.XDSClientTLSKey, ServerName: c.XDSServerTLSSAN})
		if err != nil {
			return xo, err
		}
		xo.DialOptions = []grpc.DialOption{dial}
	}
	return xo, nil
}
