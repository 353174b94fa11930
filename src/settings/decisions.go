package settings

import (
	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/service"
)

// Decisions is how answers are decided and what they carry beside the
// code.
type Decisions struct {
	ShadowMode bool `envconfig:"SHADOW_MODE" default:"false"`
	// QuotaMode treats every descriptor as quota_mode: a limit past its
	// budget is reported, and only rejects the request when every limited
	// descriptor is past its budget (as the reference's quota mode).
	QuotaMode                          bool `envconfig:"QUOTA_MODE" default:"false"`
	StopCacheKeyIncrementWhenOverlimit bool `envconfig:"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT" default:"false"`

	// BackendFailurePolicy answers descriptors without their own
	// failure_policy when the store fails: error, allow, deny or local;
	// unset, FailurePolicy picks one for the backend.
	BackendFailurePolicy string `envconfig:"BACKEND_FAILURE_POLICY"`

	// Response decorations.
	LimitResponseHeadersEnabled bool   `envconfig:"LIMIT_RESPONSE_HEADERS_ENABLED" default:"false"`
	LimitLimitHeader            string `envconfig:"LIMIT_LIMIT_HEADER" default:"RateLimit-Limit"`
	LimitRemainingHeader        string `envconfig:"LIMIT_REMAINING_HEADER" default:"RateLimit-Remaining"`
	LimitResetHeader            string `envconfig:"LIMIT_RESET_HEADER" default:"RateLimit-Reset"`
	ResponseDynamicMetadata     bool   `envconfig:"RESPONSE_DYNAMIC_METADATA" default:"false"`
	// ResponseDynamicMetadataRules adds what decided each descriptor to the
	// dynamic metadata: rule, source, match, limit (ours).
	ResponseDynamicMetadataRules bool `envconfig:"RESPONSE_DYNAMIC_METADATA_RULES" default:"false"`
}

// FailurePolicy is BACKEND_FAILURE_POLICY, or when it is unset what
// envoyproxy/ratelimit does on that backend: on memcache it logs a failed
// call and answers as if nothing were counted (allow); on Redis it answers
// an error (error, here Unavailable).
func (s Settings) FailurePolicy() config.FailurePolicy {
	switch {
	case s.BackendFailurePolicy != "":
		return config.FailurePolicy(s.BackendFailurePolicy)
	case s.Backend() == "memcache":
		return config.PolicyAllow
	}
	return config.PolicyError
}

// ServiceOptions is what the settings say of the RLS handler: how it
// decides and answers, and the request bounds; cmd/server adds the stores,
// the config holder, metrics and the log.
func (s Settings) ServiceOptions() service.Options {
	return service.Options{
		FailurePolicy:              s.FailurePolicy(),
		ShadowMode:                 s.ShadowMode,
		QuotaMode:                  s.QuotaMode,
		StopIncrementWhenOverLimit: s.StopCacheKeyIncrementWhenOverlimit,
		SharedWindows:              s.RLQSShared && s.RLQSEnabled,
		Headers: service.Headers{Enabled: s.LimitResponseHeadersEnabled, Limit: s.LimitLimitHeader,
			Remaining: s.LimitRemainingHeader, Reset: s.LimitResetHeader},
		DynamicMetadata:      s.ResponseDynamicMetadata,
		DynamicMetadataRules: s.ResponseDynamicMetadataRules,
		Limits: service.Limits{MaxDescriptors: s.RequestMaxDescriptors, MaxEntries: s.RequestMaxEntries,
			MaxStringBytes: s.RequestMaxStringBytes, MaxHits: s.RequestMaxHits, MaxKeys: s.RequestMaxKeys},
	}
}
