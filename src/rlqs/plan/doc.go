// Package plan is RLQS's policy, as functions over values: what a
// bucket's demand is from its reports (Demand), how one limit's tokens are
// shared among the buckets that draw on it, and overbooked where reports
// give back what a window did not use (Fill), and what token bucket
// carries a grant (CapacityFor, TokenBucket).
//
// It knows nothing of streams, stores, clocks or locks. The rlqs package
// copies what it knows of a pool and its members into Limit and Member
// values, calls Fill, and applies the Shares that come back; it feeds each
// report's count and interval to a bucket's Demand. Whatever the policy
// decides, exactness is not its concern: rlqs reserves every grant in the
// store, window by window, before it is sent (its ledgers), and cuts what
// does not fit. A new policy goes here, and can only ever cost use, never
// go over.
//
// Each tuned constant's comment states the invariant it keeps and names
// the test that pins it; the figures measured for it live in docs/rlqs.md.
package plan
