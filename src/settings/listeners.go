package settings

import (
	"net"
	"strconv"
	"time"

	"github.com/openrls/ratelimit/src/server"
	"github.com/openrls/ratelimit/src/server/h2guard"
)

// Listeners is the ports and what guards them: addresses, gRPC TLS,
// connection and call caps, and POST /json.
type Listeners struct {
	Host     string `envconfig:"HOST" default:"0.0.0.0"`
	Port     int    `envconfig:"PORT" default:"8080"`
	GRPCHost string `envconfig:"GRPC_HOST" default:"0.0.0.0"`
	GRPCPort int    `envconfig:"GRPC_PORT" default:"8081"`
	// GRPCUDS, when set, serves gRPC on this Unix socket path instead of
	// GRPC_HOST:GRPC_PORT.
	GRPCUDS string `envconfig:"GRPC_UDS"`
	// DebugHost is loopback by default (the reference binds every
	// interface): the debug port serves pprof and the config.
	DebugHost string `envconfig:"DEBUG_HOST" default:"127.0.0.1"`
	DebugPort int    `envconfig:"DEBUG_PORT" default:"6070"`
	// gRPC server TLS and mTLS; files are re-read when they change.
	GRPCServerUseTLS    bool   `envconfig:"GRPC_SERVER_USE_TLS" default:"false"`
	GRPCServerTLSCert   string `envconfig:"GRPC_SERVER_TLS_CERT"`
	GRPCServerTLSKey    string `envconfig:"GRPC_SERVER_TLS_KEY"`
	GRPCClientTLSCACert string `envconfig:"GRPC_CLIENT_TLS_CACERT"`
	GRPCClientTLSSAN    string `envconfig:"GRPC_CLIENT_TLS_SAN"`
	// GRPCMaxConnectionAge closes client connections after this age (with
	// GOAWAY, grpc-go adding up to a tenth either way as jitter) so that clients re-resolve and
	// spread over new replicas; the grace is how long calls in flight then
	// get. 0 means never.
	GRPCMaxConnectionAge      time.Duration `envconfig:"GRPC_MAX_CONNECTION_AGE" default:"24h"`
	GRPCMaxConnectionAgeGrace time.Duration `envconfig:"GRPC_MAX_CONNECTION_AGE_GRACE" default:"1h"`
	// GRPCMaxConcurrentStreams bounds the calls in flight on one gRPC
	// connection (ours).
	GRPCMaxConcurrentStreams int `envconfig:"GRPC_MAX_CONCURRENT_STREAMS" default:"1000"`
	// Guards against one client taking the gRPC listener (ours): open
	// connections, calls in flight across them, how long a connection may
	// sit without calls, and how long an answer may wait for the client to
	// read it before its connection is closed.
	GRPCMaxConnections           int `envconfig:"GRPC_MAX_CONNECTIONS" default:"10000"`
	GRPCMaxConnectionsPerAddress int `envconfig:"GRPC_MAX_CONNECTIONS_PER_ADDRESS" default:"1000"`
	// HTTPMaxConnections and HTTPMaxConnectionsPerAddress cap each HTTP
	// listener (the HTTP port, the debug port, PROMETHEUS_ADDR); an idle
	// keep-alive connection gives way to a new one.
	HTTPMaxConnections           int           `envconfig:"HTTP_MAX_CONNECTIONS" default:"1024"`
	HTTPMaxConnectionsPerAddress int           `envconfig:"HTTP_MAX_CONNECTIONS_PER_ADDRESS" default:"256"`
	GRPCMaxCallsInFlight         int           `envconfig:"GRPC_MAX_CALLS_IN_FLIGHT" default:"10000"`
	GRPCMaxConnectionIdle        time.Duration `envconfig:"GRPC_MAX_CONNECTION_IDLE" default:"15m"`
	GRPCStreamWriteTimeout       time.Duration `envconfig:"GRPC_STREAM_WRITE_TIMEOUT" default:"30s"`
	GRPCMaxResetsPerSecond       int           `envconfig:"GRPC_MAX_RESETS_PER_SECOND" default:"200"`
	// GRPCAbuseCooldown refuses new connections from an address for this
	// long after one of its connections was closed for abuse (0: never).
	GRPCAbuseCooldown time.Duration `envconfig:"GRPC_ABUSE_COOLDOWN" default:"10s"`
	// JSONEndpointEnabled serves POST /json on the HTTP port. Unset: on,
	// except when gRPC requires client certificates, since the HTTP port
	// has none and would let any client around them.
	JSONEndpointEnabled *bool `envconfig:"JSON_ENDPOINT_ENABLED"`
}

// JSONEndpoint reports whether POST /json is served, with the default
// applied: on unless gRPC requires client certificates.
func (s Settings) JSONEndpoint() bool {
	if s.JSONEndpointEnabled != nil {
		return *s.JSONEndpointEnabled
	}
	return s.GRPCClientTLSCACert == ""
}

// validateListeners checks the ports, gRPC TLS and connection lifetimes.
func (s Settings) validateListeners(bad complaint) {
	for _, p := range []struct {
		name string
		v    int
	}{{"PORT", s.Port}, {"GRPC_PORT", s.GRPCPort}, {"DEBUG_PORT", s.DebugPort}} {
		if p.v < 0 || p.v > 65535 {
			bad(p.name, "port %d out of range 0-65535", p.v)
		}
	}
	if s.GRPCServerUseTLS && (s.GRPCServerTLSCert == "" || s.GRPCServerTLSKey == "") {
		bad("GRPC_SERVER_TLS_CERT", "and GRPC_SERVER_TLS_KEY are required with GRPC_SERVER_USE_TLS=true")
	}
	if !s.GRPCServerUseTLS && s.GRPCClientTLSCACert != "" {
		bad("GRPC_CLIENT_TLS_CACERT", "needs GRPC_SERVER_USE_TLS=true")
	}
	if s.GRPCMaxConnectionAge < 0 || s.GRPCMaxConnectionAgeGrace < 0 || s.GRPCMaxConnectionIdle < 0 {
		bad("GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE and GRPC_MAX_CONNECTION_IDLE must not be negative")
	}
	if s.GRPCAbuseCooldown < 0 {
		bad("GRPC_ABUSE_COOLDOWN", "must not be negative, got %v", s.GRPCAbuseCooldown)
	}
	if s.GRPCStreamWriteTimeout <= 0 {
		bad("GRPC_STREAM_WRITE_TIMEOUT", "must be positive, got %v", s.GRPCStreamWriteTimeout)
	}
}

// GuardOptions is the gRPC listener's guard as set: GRPC_ABUSE_COOLDOWN=0
// turns probation off, which h2guard spells as a negative cooldown (its
// zero is its default).
func (l Listeners) GuardOptions() h2guard.Options {
	cooldown := l.GRPCAbuseCooldown
	if cooldown == 0 {
		cooldown = -1
	}
	return h2guard.Options{MaxConnections: l.GRPCMaxConnections, MaxConnectionsPerAddress: l.GRPCMaxConnectionsPerAddress,
		MaxInFlight: l.GRPCMaxCallsInFlight, ResetsPerSecond: l.GRPCMaxResetsPerSecond,
		StreamWriteTimeout: l.GRPCStreamWriteTimeout, Cooldown: cooldown}
}

// ServerOptions is what the settings say of the listeners; cmd/server adds
// what runs behind them (the service, handlers, TLS config, metrics, log).
func (s Settings) ServerOptions() server.Options {
	return server.Options{
		GRPCAddr:                hostPort(s.GRPCHost, s.GRPCPort),
		GRPCUnixSocket:          s.GRPCUDS,
		HTTPAddr:                hostPort(s.Host, s.Port),
		DebugAddr:               hostPort(s.DebugHost, s.DebugPort),
		MaxRequestBytes:         s.RequestMaxBytes,
		MaxRequestBytesInFlight: s.GRPCMaxRequestBytesInFlight,
		MaxConcurrentStreams:    uint32(s.GRPCMaxConcurrentStreams),
		MaxConnectionIdle:       s.GRPCMaxConnectionIdle,
		Guard:                   s.GuardOptions(),
		HTTPLimits:              server.HTTPLimits{MaxConnections: s.HTTPMaxConnections, MaxConnectionsPerAddress: s.HTTPMaxConnectionsPerAddress},
		MetricsPath:             s.PrometheusPath,
		MaxConnectionAge:        s.GRPCMaxConnectionAge,
		MaxConnectionAgeGrace:   s.GRPCMaxConnectionAgeGrace,
	}
}

// GRPCTLSOptions is the gRPC listener's TLS files.
func (l Listeners) GRPCTLSOptions() server.TLSOptions {
	return server.TLSOptions{CertFile: l.GRPCServerTLSCert, KeyFile: l.GRPCServerTLSKey,
		ClientCAFile: l.GRPCClientTLSCACert, ClientSAN: l.GRPCClientTLSSAN}
}

func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }
