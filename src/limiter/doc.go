// Package limiter holds the vocabulary of rate limiting (Rule, Hit, Outcome),
// the pure arithmetic of each algorithm, the Store interface that every
// backend implements, and the embedded in-memory store.
//
// It sits at the bottom of the request path: the service turns a request into
// Hits (with the config package's help) and hands them to a Store in one
// batch. limiter imports nothing else from this module, so config, redis and
// service can all depend on it without cycles.
//
// Time is always a value passed in (microseconds since the Unix epoch in the
// math, a time.Time at the Store seam), never read from a global clock, so
// every algorithm is deterministic under test and the Redis scripts can mirror
// the Go math line for line.
package limiter
