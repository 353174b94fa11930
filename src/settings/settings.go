// Package settings reads the service's environment once, into one struct,
// with the variable names of envoyproxy/ratelimit wherever the concept
// exists. No other package reads the environment. Settings embeds one
// group per concern, each in its own file (listeners, config source,
// requests, decisions, store, observability), and each group's methods
// return the Options of the package it configures, so that cmd/server only
// adds what runs (stores, handlers, loggers, callbacks).
package settings

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"

	"github.com/openrls/ratelimit/src/redis"
)

// Settings is the whole environment. Field docs give the default.
type Settings struct {
	Listeners
	ConfigSource
	Requests
	Decisions
	Store
	Observability
	RLQS
}

// Load reads the environment and validates it. The error names every bad
// variable.
func Load() (Settings, error) {
	var s Settings
	for _, p := range []struct {
		prefix string
		dst    any
	}{{"", &s}, {"REDIS", &s.Redis}, {"REDIS_PERSECOND", &s.RedisPerSecondConfig}} {
		if err := envconfig.Process(p.prefix, p.dst); err != nil {
			// envconfig stops at the first bad variable: name them all,
			// and what is wrong with the others too.
			bad, all := parseErrors()
			if all == nil {
				return s, cleanEnvconfigError(err)
			}
			return s, errors.Join(all, validateWithout(bad))
		}
	}
	s.normalize()
	return s, s.Validate()
}

// validateWithout validates the settings as if the variables named were
// not set (they did not parse, and are reported already), so that one run
// names every bad variable. It runs at start-up, before anything else reads
// the environment, which it restores.
func validateWithout(names []string) error {
	saved := map[string]string{}
	for _, n := range names {
		saved[n] = os.Getenv(n)
		_ = os.Unsetenv(n)
	}
	defer func() {
		for n, v := range saved {
			_ = os.Setenv(n, v)
		}
	}()
	if _, err := Load(); err != nil {
		return err
	}
	return nil
}

// normalize applies what depends on other variables: the older names of
// the flush period, the reference's case-insensitive enums, the socket type
// inferred from the URL, the reference's Redis URL defaults, and the
// per-second Redis's TLS files defaulting to the main ones (the reference
// has one set of TLS files for both).
func (s *Settings) normalize() {
	if _, set := os.LookupEnv("STATS_FLUSH_INTERVAL"); !set {
		switch {
		case s.GostatsFlushIntervalSeconds > 0:
			s.StatsFlushInterval = time.Duration(s.GostatsFlushIntervalSeconds) * time.Second
		case s.StatsdFlushInterval > 0:
			s.StatsFlushInterval = s.StatsdFlushInterval
		}
	}
	s.StatsdProtocol = strings.ToLower(s.StatsdProtocol)
	if strings.EqualFold(s.BackendType, "redis") {
		if s.Redis.URL == "" {
			s.Redis.URL = referenceRedisURL
		}
		if s.RedisPerSecond && s.RedisPerSecondConfig.URL == "" {
			s.RedisPerSecondConfig.URL = referenceRedisPerSecondURL
		}
	}
	s.Redis.normalize()
	s.RedisPerSecondConfig.normalize()
	ps := &s.RedisPerSecondConfig
	if ps.TLSCACert == "" && ps.TLSClientCert == "" && ps.TLSClientKey == "" {
		ps.TLSCACert, ps.TLSClientCert, ps.TLSClientKey = s.Redis.TLSCACert, s.Redis.TLSClientCert, s.Redis.TLSClientKey
		if _, set := os.LookupEnv("REDIS_PERSECOND_TLS_SKIP_HOSTNAME_VERIFICATION"); !set {
			ps.TLSSkipHostnameVerify = s.Redis.TLSSkipHostnameVerify
		}
	}
}

// ignored are envoyproxy/ratelimit variables for what this service does
// not do, with why: setting one is reported at start-up, never silently
// ignored. None of them changes a decision.
var ignored = map[string]string{
	"REDIS_CLUSTER_PIPELINE_PARALLELISM": "batches to a Redis Cluster already go to every node at once " +
		"(REDIS_PIPELINE_MAX_IN_FLIGHT bounds them)",
	"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM": "batches to a Redis Cluster already go to every node at once " +
		"(REDIS_PERSECOND_PIPELINE_MAX_IN_FLIGHT bounds them)",
	"REDIS_STARTUP_INITIAL_INTERVAL": redisStartup,
	"REDIS_STARTUP_MAX_INTERVAL":     redisStartup,
	"REDIS_STARTUP_MAX_ELAPSED_TIME": redisStartup,
}

// redisStartup is why the reference's start-up retry settings are not read.
const redisStartup = "this service never stops or waits at start-up for Redis: it serves at once (answering by " +
	"failure policy) and connects as soon as Redis answers, retrying for as long as it runs"

// Warnings describes, one line each, the set variables of
// envoyproxy/ratelimit that this service does not honour as the reference
// does, so that start-up can say so instead of ignoring them silently.
func Warnings() []string {
	var out []string
	for _, kv := range os.Environ() {
		name, value, _ := strings.Cut(kv, "=")
		// An empty value, common in manifests that list every variable,
		// asks for nothing: no warning.
		if why, ok := ignored[name]; ok && value != "" {
			out = append(out, name+": ignored: "+why)
			continue
		}
		if (name == "REDIS_POOL_ON_EMPTY_BEHAVIOR" || name == "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR") &&
			strings.EqualFold(value, "CREATE") {
			out = append(out, name+"=CREATE: the pool never grows past its size here; a call waits for a free "+
				"connection up to the Redis timeout instead")
		}
	}
	sort.Strings(out)
	return out
}

// Unused names, one line each, the set variables the chosen backend does
// not read, so that a value a user meant to apply is not dropped without
// a word (REDIS_URL beside BACKEND_TYPE=memory, say).
func (s Settings) Unused() []string {
	byBackend := map[string][]string{
		"memory":   {"REDIS_URL", "REDIS_PERSECOND_URL", "MEMCACHE_HOST_PORT", "MEMCACHE_SRV"},
		"memcache": {"REDIS_URL", "REDIS_PERSECOND_URL"},
		"redis":    {"MEMCACHE_HOST_PORT", "MEMCACHE_SRV"},
	}
	var out []string
	for _, r := range []struct {
		prefix string
		r      Redis
	}{{"REDIS_", s.Redis}, {"REDIS_PERSECOND_", s.RedisPerSecondConfig}} {
		if r.r.AWSIAMAuth && !r.r.TLS && !redis.WantsTLS(r.r.URL) {
			out = append(out, r.prefix+"AWS_IAM_AUTH: ElastiCache accepts IAM authentication over TLS only, and "+r.prefix+
				"TLS is not set (nor a rediss:// URL)")
		}
	}
	if s.PrometheusMapperYAML != "" && !s.UsePrometheus {
		out = append(out, "PROMETHEUS_MAPPER_YAML: ignored: USE_PROMETHEUS is not true, so nothing serves the mapping")
	}
	for _, name := range byBackend[s.Backend()] {
		if v, set := os.LookupEnv(name); set && v != "" {
			out = append(out, fmt.Sprintf("%s: ignored: the backend is %s (BACKEND_TYPE=%s); set BACKEND_TYPE to use it", name, s.Backend(), s.Backend()))
		}
	}
	return out
}

// parseErrors checks every set variable against its field's type, as
// envconfig parses it, and returns the names of those that do not parse
// and one error for each, in the order of Names.
func parseErrors() (names []string, err error) {
	var errs []error
	eachVar(func(name string, f reflect.StructField) {
		v, set := os.LookupEnv(name)
		if !set || v == "" {
			return
		}
		if want := parses(f.Type, v); want != "" {
			names = append(names, name)
			errs = append(errs, fmt.Errorf("%s: invalid value %q: want %s", name, v, want))
		}
	})
	return names, errors.Join(errs...)
}

// parses returns "" if v parses as a value of type t, else the type's name
// as envconfig's errors give it.
func parses(t reflect.Type, v string) string {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var err error
	switch {
	case t == reflect.TypeOf(time.Duration(0)):
		_, err = time.ParseDuration(v)
	case t.Kind() == reflect.Bool:
		_, err = strconv.ParseBool(v)
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		_, err = strconv.ParseInt(v, 0, 64)
	case t.Kind() == reflect.Uint64:
		_, err = strconv.ParseUint(v, 0, 64)
	case t.Kind() == reflect.Float64:
		_, err = strconv.ParseFloat(v, 64)
	}
	switch {
	case err == nil:
		return ""
	case t == reflect.TypeOf(time.Duration(0)):
		return "a duration such as 500ms, 10s or 1h"
	}
	return t.String()
}

// cleanEnvconfigError turns envconfig's "envconfig.Process: assigning PORT to
// Port: converting 'x' to type int. details: ..." into "PORT: invalid value
// \"x\": ...".
func cleanEnvconfigError(err error) error {
	var pe *envconfig.ParseError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: invalid value %q: want %s", pe.KeyName, pe.Value, pe.TypeName)
	}
	return err
}

// Validate reports every invalid setting by its variable name.
func (s Settings) Validate() error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", name, fmt.Sprintf(format, args...)))
	}
	s.validateListeners(bad)
	s.validateLogs(bad)
	s.validateConfigSource(bad)
	s.validateObservability(bad)
	s.validateStore(bad)
	s.validateLease(bad)
	s.validateRequestBounds(bad)
	s.validateRLQS(bad)
	return errors.Join(errs...)
}

// complaint reports one bad variable: its name, then what is wrong.
type complaint func(name, format string, args ...any)

// Names lists every environment variable the service reads; the examples'
// tests check the deployment manifests' variables against it.
func Names() []string {
	var out []string
	eachVar(func(name string, _ reflect.StructField) { out = append(out, name) })
	sort.Strings(out)
	return out
}

// eachVar calls fn with every variable's name and field, through the
// groups Settings embeds, then the REDIS_ and REDIS_PERSECOND_ groups.
func eachVar(fn func(name string, f reflect.StructField)) {
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if f.Anonymous && f.Type.Kind() == reflect.Struct {
				walk(f.Type, prefix)
			} else if name := f.Tag.Get("envconfig"); name != "" {
				fn(prefix+name, f)
			}
		}
	}
	walk(reflect.TypeOf(Settings{}), "")
	walk(reflect.TypeOf(Redis{}), "REDIS_")
	walk(reflect.TypeOf(Redis{}), "REDIS_PERSECOND_")
}
