package config

import rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

// What tests look at, not part of the API.

// Match is match without a key.
func (d *Domain) Match(entries []*rlv3.RateLimitDescriptor_Entry) *Node { return d.match(entries, nil) }
