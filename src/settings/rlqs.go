package settings

import (
	"time"

	"github.com/openrls/ratelimit/src/rlqs"
)

// RLQS configures the Rate Limit Quota Service on the gRPC port (ours).
type RLQS struct {
	RLQSEnabled  bool          `envconfig:"RLQS_ENABLED" default:"true"`
	RLQSPush     time.Duration `envconfig:"RLQS_PUSH_INTERVAL" default:"1s"`
	RLQSTTL      time.Duration `envconfig:"RLQS_ASSIGNMENT_TTL" default:"4s"`
	RLQSDelivery time.Duration `envconfig:"RLQS_DELIVERY_BOUND" default:"1s"`
	RLQSIdle     time.Duration `envconfig:"RLQS_IDLE_ABANDON" default:"60s"`
	RLQSStreams  int           `envconfig:"RLQS_MAX_STREAMS" default:"10000"`
	RLQSBuckets  int           `envconfig:"RLQS_MAX_BUCKETS_PER_STREAM" default:"10000"`
	RLQSTotal    int           `envconfig:"RLQS_MAX_BUCKETS" default:"50000"`
	RLQSIDBytes  int           `envconfig:"RLQS_MAX_BUCKET_ID_BYTES_PER_STREAM" default:"4194304"`
	RLQSIDTotal  int           `envconfig:"RLQS_MAX_BUCKET_ID_BYTES" default:"33554432"`
	RLQSShared   bool          `envconfig:"RLQS_SHARED_COUNTERS" default:"false"`
}

// RLQSOptions is what the settings say of the quota service; cmd/server
// adds the store, the configs and the log.
func (s Settings) RLQSOptions() rlqs.Options {
	return rlqs.Options{Push: s.RLQSPush, TTL: s.RLQSTTL, Delivery: s.RLQSDelivery, Idle: s.RLQSIdle,
		MaxStreams: s.RLQSStreams, MaxBuckets: s.RLQSBuckets, MaxTotalBuckets: s.RLQSTotal, MaxIDBytes: s.RLQSIDBytes, MaxTotalIDBytes: s.RLQSIDTotal}
}

func (s Settings) validateRLQS(bad complaint) {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"RLQS_PUSH_INTERVAL", s.RLQSPush}, {"RLQS_DELIVERY_BOUND", s.RLQSDelivery}, {"RLQS_IDLE_ABANDON", s.RLQSIdle}} {
		if d.v <= 0 {
			bad(d.name, "must be positive, got %s", d.v)
		}
	}
	if s.RLQSTTL%time.Second != 0 || s.RLQSTTL < time.Second {
		bad("RLQS_ASSIGNMENT_TTL", "must be a whole number of seconds, at least 1s (Envoy reads whole seconds only), got %s", s.RLQSTTL)
	} else if s.RLQSPush > 0 && s.RLQSDelivery > 0 && s.RLQSTTL <= s.RLQSPush+s.RLQSDelivery {
		bad("RLQS_ASSIGNMENT_TTL", "must exceed RLQS_PUSH_INTERVAL plus RLQS_DELIVERY_BOUND (%s), or assignments lapse between renewals, got %s",
			s.RLQSPush+s.RLQSDelivery, s.RLQSTTL)
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"RLQS_MAX_STREAMS", s.RLQSStreams}, {"RLQS_MAX_BUCKETS_PER_STREAM", s.RLQSBuckets}, {"RLQS_MAX_BUCKETS", s.RLQSTotal},
		{"RLQS_MAX_BUCKET_ID_BYTES_PER_STREAM", s.RLQSIDBytes}, {"RLQS_MAX_BUCKET_ID_BYTES", s.RLQSIDTotal}} {
		if n.v < 1 {
			bad(n.name, "must be at least 1, got %d", n.v)
		}
	}
}
