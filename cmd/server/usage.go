package main

import (
	"fmt"
	"io"

	"github.com/openrls/ratelimit/src/buildinfo"
)

const usage = `ratelimit: an Envoy rate limit service (envoy.service.ratelimit.v3).

Usage:
  ratelimit               serve, configured by environment variables alone
  ratelimit -h | --help   print this and exit
  ratelimit --version     print the version and exit

It serves gRPC on GRPC_HOST:GRPC_PORT (0.0.0.0:8081), HTTP (/healthcheck, /json,
/metrics) on HOST:PORT (0.0.0.0:8080) and its debug port on DEBUG_HOST:DEBUG_PORT
(127.0.0.1:6070). Descriptor configs are read from
RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY (every file in it, whatever
its name: keep anything else out of it), or from xDS
with CONFIG_TYPE=GRPC_XDS_SOTW. Counters are kept in Redis when REDIS_URL is set,
else in the process (BACKEND_TYPE=memory).

Every variable, with its default: docs/settings.md. Check a config before you ship
it with config-check.
`

// commandLine answers what the service takes on its command line: it is
// configured by environment variables alone, as envoyproxy/ratelimit is, so
// arguments only ask for help or the version. stop is set when the process
// should exit with code; an argument it does not know is reported and
// ignored, so that a deployment that passes one keeps starting.
func commandLine(args []string, stdout, stderr io.Writer) (code int, stop bool) {
	if len(args) == 0 {
		return 0, false
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0, true
	case "-version", "--version", "version":
		fmt.Fprintln(stdout, buildinfo.Read())
		return 0, true
	}
	fmt.Fprintf(stderr, "ratelimit: ignoring the arguments %q: it is configured by environment variables (see --help)\n", args)
	return 0, false
}
