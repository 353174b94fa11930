// Package service is the RLS v3 handler: it validates a RateLimitRequest,
// takes the current config snapshot, asks it for a plan, applies the plan's
// hits to the store in one batch, and translates the outcomes into a
// RateLimitResponse. It also adapts the same handler to HTTP (POST /json).
//
// service owns every proto ⇄ domain translation and is the only place where
// errors become gRPC status codes. It imports config and limiter, never a
// concrete store.
package service
