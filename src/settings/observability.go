package settings

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/metrics"
	"github.com/openrls/ratelimit/src/tracing"
)

// Observability is logs, metrics, tracing and the top-limited
// counters.
type Observability struct {
	// Logs.
	LogLevel  string `envconfig:"LOG_LEVEL" default:"WARN"`
	LogFormat string `envconfig:"LOG_FORMAT" default:"text"`

	NearLimitRatio          float64 `envconfig:"NEAR_LIMIT_RATIO" default:"0.8"`
	MaxDetailedMetricSeries int     `envconfig:"MAX_DETAILED_METRIC_SERIES" default:"1000"`
	UsePrometheus           bool    `envconfig:"USE_PROMETHEUS" default:"false"`
	PrometheusAddr          string  `envconfig:"PROMETHEUS_ADDR" default:":9090"`
	PrometheusPath          string  `envconfig:"PROMETHEUS_PATH" default:"/metrics"`
	// PrometheusMapperYAML is a statsd_exporter mapping file: PROMETHEUS_ADDR
	// then serves the statsd names through it instead of the reference's
	// default mapping.
	PrometheusMapperYAML string `envconfig:"PROMETHEUS_MAPPER_YAML"`
	// PrometheusResponseTimeAsMilliseconds reports the reference's
	// ratelimit_service_response_time_seconds histogram in milliseconds.
	PrometheusResponseTimeAsMilliseconds bool `envconfig:"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS" default:"false"`
	UseStatsd                            bool `envconfig:"USE_STATSD" default:"true"`
	// UseDogStatsd sends DogStatsD to STATSD_HOST:STATSD_PORT over UDP
	// instead; UseDogStatsdMogrifiers names the mogrifiers, each read from
	// DOG_STATSD_MOGRIFIER_<NAME>_{PATTERN,NAME,TAGS}.
	UseDogStatsd           bool     `envconfig:"USE_DOG_STATSD" default:"false"`
	UseDogStatsdMogrifiers []string `envconfig:"USE_DOG_STATSD_MOGRIFIERS"`
	StatsdHost             string   `envconfig:"STATSD_HOST" default:"localhost"`
	StatsdPort             int      `envconfig:"STATSD_PORT" default:"8125"`
	// StatsdProtocol is tcp, as the reference sends, or udp (ours).
	StatsdProtocol     string        `envconfig:"STATSD_PROTOCOL" default:"tcp"`
	StatsFlushInterval time.Duration `envconfig:"STATS_FLUSH_INTERVAL" default:"10s"`
	// StatsdFlushInterval and GostatsFlushIntervalSeconds are older names of
	// the flush period, used only while STATS_FLUSH_INTERVAL is unset.
	StatsdFlushInterval         time.Duration `envconfig:"STATSD_FLUSH_INTERVAL" default:"0"`
	GostatsFlushIntervalSeconds int           `envconfig:"GOSTATS_FLUSH_INTERVAL_SECONDS" default:"0"`
	// DisableStats sends no statsd and serves none of the reference's
	// series on PROMETHEUS_ADDR; /metrics on the HTTP port stays.
	DisableStats bool   `envconfig:"DISABLE_STATS" default:"false"`
	ExtraTags    string `envconfig:"EXTRA_TAGS"`
	// Tracing (OpenTelemetry, OTLP; endpoint from OTEL_EXPORTER_OTLP_*).
	TracingEnabled           bool    `envconfig:"TRACING_ENABLED" default:"false"`
	TracingExporterProtocol  string  `envconfig:"TRACING_EXPORTER_PROTOCOL" default:"http"`
	TracingServiceName       string  `envconfig:"TRACING_SERVICE_NAME" default:"RateLimit"`
	TracingServiceNamespace  string  `envconfig:"TRACING_SERVICE_NAMESPACE"`
	TracingServiceInstanceID string  `envconfig:"TRACING_SERVICE_INSTANCE_ID"`
	TracingSamplingRate      float64 `envconfig:"TRACING_SAMPLING_RATE" default:"1"`
	// Who is limited most (ours): counters kept per window (0: off), the
	// window, and how many of the top to export as Prometheus series (0:
	// none; they carry request values, hashed where keys hash them).
	TopLimitedSize   int           `envconfig:"TOP_LIMITED_SIZE" default:"1024"`
	TopLimitedWindow time.Duration `envconfig:"TOP_LIMITED_WINDOW" default:"5m"`
	TopLimitedMetric int           `envconfig:"TOP_LIMITED_METRIC" default:"0"`
}

// validateLogs checks LOG_LEVEL and LOG_FORMAT.
func (s Settings) validateLogs(bad complaint) {
	if _, err := logrus.ParseLevel(s.LogLevel); err != nil {
		bad("LOG_LEVEL", "unknown level %q (want debug, info, warn, error)", s.LogLevel)
	}
	if f := strings.ToLower(s.LogFormat); f != "text" && f != "json" {
		bad("LOG_FORMAT", "unknown format %q (want text or json)", s.LogFormat)
	}
}

// validateObservability checks statsd, metrics, tracing and /limited.
func (s Settings) validateObservability(bad complaint) {
	if s.UseDogStatsd && (s.UseStatsd || s.UsePrometheus) {
		bad("USE_DOG_STATSD", "unable to use more than one stats sink at the same time: set one of USE_DOG_STATSD, USE_STATSD, "+
			"USE_PROMETHEUS (USE_STATSD is true unless set to false)")
	}
	if _, err := s.Mogrifiers(); err != nil {
		bad("USE_DOG_STATSD_MOGRIFIERS", "%v", err)
	}
	if s.StatsdProtocol != "tcp" && s.StatsdProtocol != "udp" {
		bad("STATSD_PROTOCOL", "unknown protocol %q (want tcp or udp)", s.StatsdProtocol)
	}
	if s.StatsFlushInterval <= 0 {
		bad("STATS_FLUSH_INTERVAL", "must be positive, got %v", s.StatsFlushInterval)
	}
	if s.NearLimitRatio <= 0 || s.NearLimitRatio > 1 {
		bad("NEAR_LIMIT_RATIO", "must be in (0, 1], got %v", s.NearLimitRatio)
	}
	if s.MaxDetailedMetricSeries < 1 {
		bad("MAX_DETAILED_METRIC_SERIES", "must be at least 1, got %d", s.MaxDetailedMetricSeries)
	}
	if s.StatsdPort < 1 || s.StatsdPort > 65535 {
		bad("STATSD_PORT", "port %d out of range 1-65535", s.StatsdPort)
	}
	if _, err := pairs(s.ExtraTags, ":"); err != nil {
		bad("EXTRA_TAGS", "%v (want k1:v1,k2:v2)", err)
	}
	if !strings.HasPrefix(s.PrometheusPath, "/") {
		bad("PROMETHEUS_PATH", "must start with /, got %q", s.PrometheusPath)
	}
	if p := strings.ToLower(s.TracingExporterProtocol); p != "http" && p != "grpc" {
		bad("TRACING_EXPORTER_PROTOCOL", "unknown protocol %q (want http or grpc)", s.TracingExporterProtocol)
	}
	if s.TracingSamplingRate < 0 || s.TracingSamplingRate > 1 {
		bad("TRACING_SAMPLING_RATE", "must be in [0, 1], got %v", s.TracingSamplingRate)
	}
	if s.TopLimitedSize < 0 || s.TopLimitedMetric < 0 || s.TopLimitedMetric > 1000 {
		bad("TOP_LIMITED_SIZE", "and TOP_LIMITED_METRIC must not be negative, TOP_LIMITED_METRIC at most 1000")
	}
	if s.TopLimitedWindow <= 0 {
		bad("TOP_LIMITED_WINDOW", "must be positive, got %v", s.TopLimitedWindow)
	}
}

// Tags returns EXTRA_TAGS as a map (validated by Load).
func (o Observability) Tags() map[string]string {
	t, _ := pairs(o.ExtraTags, ":")
	return t
}

// Mogrifiers reads USE_DOG_STATSD_MOGRIFIERS's mogrifiers from their
// DOG_STATSD_MOGRIFIER_<NAME>_PATTERN, _NAME and _TAGS variables, as the
// reference reads them; an error names the variable that is wrong.
func (o Observability) Mogrifiers() ([]metrics.Mogrifier, error) {
	var out []metrics.Mogrifier
	for _, name := range o.UseDogStatsdMogrifiers {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		v := "DOG_STATSD_MOGRIFIER_" + name + "_"
		pattern := os.Getenv(v + "PATTERN")
		if pattern == "" {
			return nil, fmt.Errorf("mogrifier %s: %sPATTERN is not set", name, v)
		}
		re, err := regexp.Compile(pattern)
		if err != nil {
			return nil, fmt.Errorf("mogrifier %s: %sPATTERN: %w", name, v, err)
		}
		m := metrics.Mogrifier{Pattern: re, Name: os.Getenv(v + "NAME")}
		if m.Name == "" {
			return nil, fmt.Errorf("mogrifier %s: %sNAME is not set", name, v)
		}
		if tags := os.Getenv(v + "TAGS"); tags != "" {
			for _, kv := range strings.Split(tags, ",") {
				k, val, _ := strings.Cut(kv, ":")
				if k == "" || val == "" {
					return nil, fmt.Errorf("mogrifier %s: %sTAGS: %q is not key:value", name, v, kv)
				}
				m.Tags = append(m.Tags, metrics.MogrifierTag{Key: k, Value: val})
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// DogStatsdOptions is where and how often DogStatsD is sent, with its
// tags and mogrifiers (validated by Load).
func (o Observability) DogStatsdOptions() metrics.DogStatsdOptions {
	mogs, _ := o.Mogrifiers()
	return metrics.DogStatsdOptions{Addr: hostPort(o.StatsdHost, o.StatsdPort), Interval: o.StatsFlushInterval, Tags: o.Tags(),
		Mogrifiers: mogs}
}

// TracingOptions is the OpenTelemetry set-up.
func (o Observability) TracingOptions() tracing.Options {
	return tracing.Options{Enabled: o.TracingEnabled, Protocol: o.TracingExporterProtocol,
		ServiceName: o.TracingServiceName, Namespace: o.TracingServiceNamespace, InstanceID: o.TracingServiceInstanceID,
		SamplingRate: o.TracingSamplingRate}
}

// StatsdOptions is where and how often statsd is sent; cmd/server adds
// what an outage and a recovery do.
func (o Observability) StatsdOptions() metrics.StatsdOptions {
	return metrics.StatsdOptions{Network: o.StatsdProtocol, Addr: hostPort(o.StatsdHost, o.StatsdPort),
		Interval: o.StatsFlushInterval, Tags: o.Tags()}
}

// MetricsOptions is the registry's: the near-limit ratio, the detailed
// series cap, and whether the reference's Prometheus series are kept.
func (o Observability) MetricsOptions() metrics.Options {
	var policies []string
	for _, p := range config.FailurePolicies {
		policies = append(policies, string(p))
	}
	return metrics.Options{NearLimitRatio: o.NearLimitRatio, MaxDetailedSeries: o.MaxDetailedMetricSeries, FailurePolicies: policies,
		Reference: o.UsePrometheus && !o.DisableStats, ReferenceMillis: o.PrometheusResponseTimeAsMilliseconds}
}
