package settings_test

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/redis"
	"github.com/openrls/ratelimit/src/rlqs"
	"github.com/openrls/ratelimit/src/server"
	"github.com/openrls/ratelimit/src/server/h2guard"
	"github.com/openrls/ratelimit/src/service"
	"github.com/openrls/ratelimit/src/settings"
)

// TestDefaultsMatchThePackages: where a package has a default of its own
// for what a setting configures (what a zero option means), the setting's
// default is that same value, so that the service and the packages' own
// users (tests, tools) agree, and a change in one place shows here.
func TestDefaultsMatchThePackages(t *testing.T) {
	defaults := map[string]string{}
	settings.EachVar(func(name string, f reflect.StructField) { defaults[name] = f.Tag.Get("default") })
	// config-check's request bounds, without the service's packages.
	for name, v := range map[string]int{"REQUEST_MAX_ENTRIES": config.DefaultRequestBounds.MaxEntries,
		"REQUEST_MAX_STRING_BYTES": config.DefaultRequestBounds.MaxStringBytes,
		"REQUEST_MAX_BYTES":        config.DefaultRequestBounds.MaxRequestBytes} {
		if def := defaults[name]; def != fmt.Sprint(v) {
			t.Errorf("%s defaults to %q, config.DefaultRequestBounds to %d", name, def, v)
		}
	}
	for name, pkg := range map[string]any{
		"REQUEST_MAX_DESCRIPTORS":             service.DefaultLimits.MaxDescriptors,
		"REQUEST_MAX_ENTRIES":                 service.DefaultLimits.MaxEntries,
		"REQUEST_MAX_STRING_BYTES":            service.DefaultLimits.MaxStringBytes,
		"REQUEST_MAX_HITS":                    service.DefaultLimits.MaxHits,
		"REQUEST_MAX_KEYS":                    service.DefaultLimits.MaxKeys,
		"REQUEST_MAX_BYTES":                   server.DefaultMaxRequestBytes,
		"GRPC_MAX_CONCURRENT_STREAMS":         server.DefaultMaxConcurrentStreams,
		"GRPC_MAX_REQUEST_BYTES_IN_FLIGHT":    server.DefaultMaxRequestBytesInFlight,
		"GRPC_MAX_CONNECTIONS":                h2guard.Default.MaxConnections,
		"GRPC_MAX_CONNECTIONS_PER_ADDRESS":    h2guard.Default.MaxConnectionsPerAddress,
		"GRPC_MAX_CALLS_IN_FLIGHT":            h2guard.Default.MaxInFlight,
		"GRPC_MAX_RESETS_PER_SECOND":          h2guard.Default.ResetsPerSecond,
		"GRPC_STREAM_WRITE_TIMEOUT":           h2guard.Default.StreamWriteTimeout,
		"GRPC_ABUSE_COOLDOWN":                 h2guard.Default.Cooldown,
		"MEMORY_MAX_KEYS":                     limiter.DefaultMaxKeys,
		"MEMORY_MAX_BYTES":                    limiter.DefaultMaxBytes,
		"LEASE_IDLE":                          redis.DefaultLeaseIdle,
		"RLQS_PUSH_INTERVAL":                  rlqs.DefaultPush,
		"RLQS_ASSIGNMENT_TTL":                 rlqs.DefaultTTL,
		"RLQS_DELIVERY_BOUND":                 rlqs.DefaultDelivery,
		"RLQS_IDLE_ABANDON":                   rlqs.DefaultIdle,
		"RLQS_MAX_STREAMS":                    rlqs.DefaultMaxStreams,
		"RLQS_MAX_BUCKETS_PER_STREAM":         rlqs.DefaultMaxBuckets,
		"RLQS_MAX_BUCKETS":                    rlqs.DefaultMaxTotalBuckets,
		"RLQS_MAX_BUCKET_ID_BYTES_PER_STREAM": rlqs.DefaultMaxIDBytes,
		"RLQS_MAX_BUCKET_ID_BYTES":            rlqs.DefaultMaxTotalIDBytes,
	} {
		def, ok := defaults[name]
		if !ok {
			t.Errorf("%s is not a setting", name)
			continue
		}
		want := fmt.Sprint(pkg)
		if d, isDur := pkg.(time.Duration); isDur {
			if got, err := time.ParseDuration(def); err != nil || got != d {
				t.Errorf("%s defaults to %q, the package to %v", name, def, d)
			}
			continue
		}
		if def != want {
			t.Errorf("%s defaults to %q, the package to %s", name, def, want)
		}
	}
}
