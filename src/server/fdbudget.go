package server

import (
	"syscall"

	"github.com/sirupsen/logrus"
)

// fdReserve is kept out of every connection cap: config files, Redis and
// statsd connections, the xDS stream, tracing, /proc reads.
const fdReserve = 128

// fitDescriptors lowers the connection caps, if they must, so that the
// listeners together can never take every file descriptor (RLIMIT_NOFILE,
// which Go raises to its hard limit at start-up): each HTTP listener gets
// at most an eighth of what the reserve leaves, and the gRPC port the rest
// of it, so a flood on one port leaves descriptors for the others, for
// health checks and for Redis. A cap it lowers is logged.
func fitDescriptors(o *Options, limit uint64, log logrus.FieldLogger) {
	if limit <= fdReserve*2 {
		limit = fdReserve * 2
	}
	budget := int(min(limit, 1<<30)) - fdReserve
	httpShare := max(budget/8, 16)
	if o.HTTPLimits.MaxConnections > httpShare {
		log.WithField("file_descriptors", limit).Warnf("HTTP_MAX_CONNECTIONS lowered from %d to %d per HTTP listener to fit the file descriptor limit",
			o.HTTPLimits.MaxConnections, httpShare)
		o.HTTPLimits.MaxConnections = httpShare
	}
	o.HTTPLimits.MaxConnectionsPerAddress = min(o.HTTPLimits.MaxConnectionsPerAddress, o.HTTPLimits.MaxConnections)
	grpcShare := max(budget-3*o.HTTPLimits.MaxConnections, 16)
	if o.Guard.MaxConnections > grpcShare {
		log.WithField("file_descriptors", limit).Warnf("GRPC_MAX_CONNECTIONS lowered from %d to %d to fit the file descriptor limit",
			o.Guard.MaxConnections, grpcShare)
		o.Guard.MaxConnections = grpcShare
	}
	o.Guard.MaxConnectionsPerAddress = min(o.Guard.MaxConnectionsPerAddress, o.Guard.MaxConnections)
}

// openFileLimit is RLIMIT_NOFILE's soft limit, or 0 if it cannot be read.
func openFileLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	return r.Cur
}
