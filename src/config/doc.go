// Package config turns descriptor YAML (the envoyproxy/ratelimit format plus
// our extensions) into an immutable *Config, and answers, for one RLS
// request, which limits apply to which descriptors and under which keys.
//
// Parse reads one file into a *File, reporting every problem with file, line
// and path. Build merges files into a *Config and validates what only shows
// across files. A *Config is never modified after Build, so a server can swap
// it atomically and let in-flight requests finish on the one they started with.
//
// On the request path, Config.Plan matches each request descriptor against
// the tree (exact value, then wildcard, then key only, at every level; a limit
// applies only at the depth of the descriptor's last entry), applies per-request
// overrides and `replaces`, and produces limiter.Hits with their keys.
//
// config imports limiter (for Rule and Hit), escape, its internal packages
// and the RLS descriptor proto; it knows nothing of Redis, gRPC serving,
// settings, logs or metrics. Holding the served config, reloading and
// watching its files are package reload's.
package config
