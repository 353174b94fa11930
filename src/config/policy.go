package config

import "slices"

// FailurePolicy is what to answer for a descriptor when the store fails.
type FailurePolicy string

// The failure policies; the empty one inherits (a descriptor's parent's,
// else BACKEND_FAILURE_POLICY).
const (
	PolicyError FailurePolicy = "error" // Unavailable: Envoy's failure_mode_deny decides
	PolicyAllow FailurePolicy = "allow" // OK
	PolicyDeny  FailurePolicy = "deny"  // OVER_LIMIT
	PolicyLocal FailurePolicy = "local" // count in this process's memory meanwhile
)

// FailurePolicies lists every policy, in the order errors name them.
var FailurePolicies = []FailurePolicy{PolicyError, PolicyAllow, PolicyDeny, PolicyLocal}

// Valid reports whether p names a failure policy.
func (p FailurePolicy) Valid() bool { return slices.Contains(FailurePolicies, p) }
