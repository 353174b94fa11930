package config

import (
	"strings"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// What tests look at, not part of the API.

// Match is match without a key.
func (d *Domain) Match(entries []*rlv3.RateLimitDescriptor_Entry) *Node { return d.match(entries, nil) }

// Dump is WriteDump's lines as one string, for golden tests.
func (c *Config) Dump() string {
	var b strings.Builder
	_ = c.WriteDump(&b)
	return b.String()
}
