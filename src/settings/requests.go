package settings

import (
	"math"

	"github.com/openrls/ratelimit/src/config"
)

// Requests bounds what one request may ask.
type Requests struct {
	// Request size limits (answered InvalidArgument beyond them).
	RequestMaxDescriptors int `envconfig:"REQUEST_MAX_DESCRIPTORS" default:"64"`
	RequestMaxEntries     int `envconfig:"REQUEST_MAX_ENTRIES" default:"32"`
	RequestMaxStringBytes int `envconfig:"REQUEST_MAX_STRING_BYTES" default:"4096"`
	// RequestMaxBytes bounds one gRPC request message (ours).
	RequestMaxBytes int `envconfig:"REQUEST_MAX_BYTES" default:"262144"`
	// RequestMaxHits bounds a descriptor's hits_addend; RequestMaxKeys the
	// limits (store keys) one request's descriptors match, summed (ours).
	RequestMaxHits uint64 `envconfig:"REQUEST_MAX_HITS" default:"1099511627776"`
	RequestMaxKeys int    `envconfig:"REQUEST_MAX_KEYS" default:"256"`
	// GRPCMaxRequestBytesInFlight bounds the bytes of large requests
	// handled at once; past it, ResourceExhausted (ours).
	GRPCMaxRequestBytesInFlight int `envconfig:"GRPC_MAX_REQUEST_BYTES_IN_FLIGHT" default:"67108864"`
}

// validateRequestBounds checks the bounds on requests and on what gRPC clients may hold.
func (s Settings) validateRequestBounds(bad complaint) {
	for _, l := range []struct {
		name string
		v    int
	}{{"REQUEST_MAX_DESCRIPTORS", s.RequestMaxDescriptors}, {"REQUEST_MAX_ENTRIES", s.RequestMaxEntries},
		{"REQUEST_MAX_STRING_BYTES", s.RequestMaxStringBytes}, {"REQUEST_MAX_BYTES", s.RequestMaxBytes},
		{"REQUEST_MAX_KEYS", s.RequestMaxKeys}, {"GRPC_MAX_CONNECTIONS", s.GRPCMaxConnections},
		{"GRPC_MAX_CONNECTIONS_PER_ADDRESS", s.GRPCMaxConnectionsPerAddress},
		{"HTTP_MAX_CONNECTIONS", s.HTTPMaxConnections}, {"HTTP_MAX_CONNECTIONS_PER_ADDRESS", s.HTTPMaxConnectionsPerAddress},
		{"GRPC_MAX_CALLS_IN_FLIGHT", s.GRPCMaxCallsInFlight}, {"GRPC_MAX_RESETS_PER_SECOND", s.GRPCMaxResetsPerSecond},
		{"GRPC_MAX_CONCURRENT_STREAMS", s.GRPCMaxConcurrentStreams}, {"GRPC_MAX_REQUEST_BYTES_IN_FLIGHT", s.GRPCMaxRequestBytesInFlight}} {
		if l.v < 1 {
			bad(l.name, "must be at least 1, got %d", l.v)
		}
	}
	if s.GRPCMaxConcurrentStreams > math.MaxUint32 {
		bad("GRPC_MAX_CONCURRENT_STREAMS", "must be at most %d, got %d", uint32(math.MaxUint32), s.GRPCMaxConcurrentStreams)
	}
	if s.RequestMaxEntries > config.MaxDepth {
		bad("REQUEST_MAX_ENTRIES", "must be at most %d (the deepest a config may nest), got %d", config.MaxDepth, s.RequestMaxEntries)
	}
	if s.RequestMaxHits < 1 {
		bad("REQUEST_MAX_HITS", "must be at least 1")
	}
	if s.GRPCMaxRequestBytesInFlight < s.RequestMaxBytes {
		bad("GRPC_MAX_REQUEST_BYTES_IN_FLIGHT", "must be at least REQUEST_MAX_BYTES (%d), or a request of that size is never served; got %d",
			s.RequestMaxBytes, s.GRPCMaxRequestBytesInFlight)
	}
}
