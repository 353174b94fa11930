// Package rlqs serves envoy.service.rate_limit_quota.v3 (RLQS): Envoys
// report how many requests each of their buckets saw, and are sent, per
// bucket, a token bucket to enforce by themselves, an ALLOW_ALL or a
// DENY_ALL. Whatever the fleet does, it admits at most a rule's limit in
// every aligned window of the rule's period: every token a grant could let
// through is counted in the store (the same stores RLS counts in) before
// the grant is sent.
//
// # The model
//
// A stream is one Envoy's connection for one domain. It holds buckets, one
// per bucket id the Envoy reported. A bucket whose rule limits it has one
// member per limit of its rule, and each member belongs to that limit's
// pool: every bucket of every stream on this replica that draws on the
// same counter. A member keeps a ledger, which is what its bucket may
// admit in each window of the limit's period (the envelope of every grant
// that may be in force, the tokens it may carry in, its resets) against
// what the store holds for it there. Replicas share a pool's limit by the
// demand each publishes to the store (exchangeDemand).
//
//	stream ─┬─ bucket ─┬─ member ── ledger (by window) ─┐
//	        │          └─ member ...                     ├─ pool (one limit, one counter)
//	        └─ bucket ─── member ── ledger ─────────────┘
//
// # A round
//
// Every push (RLQS_PUSH_INTERVAL), and at once for a stream's new buckets
// or a fall of demand, a round runs, one at a time (the grant lock):
//
//  1. Hand over and lend, under the service lock: grants whose messages
//     have left since the last round replace those before them, and what
//     the store holds past a window's need, or past what the reports say a
//     window used, is given back (handOvers, lends).
//  2. Plan, under the service lock: each pool's members are copied into
//     plan's values and plan.Fill shares the limit; each bucket gets a job,
//     a grant with each member's ledger tried with it (plan, jobFor,
//     sizedJob).
//  3. Reserve, with the lock released: what each job's trial ledgers
//     need past what the store holds is counted in the store, in small
//     batches, give-backs first; a grant that does not fit in full is given
//     back and shrunk to what the store can hold (reserve, shrink, recount).
//  4. Commit, under the service lock: what the store granted is credited
//     to the ledgers, and each stream is sent one message (commit).
//
// A stream that closes while a round has its lock released leaves its
// buckets marked gone: the round credits what the store counted for them
// and sends nothing. What was reserved stays counted until its windows
// end, which errs toward admitting less, never more.
//
// # Who owns what
//
// The service lock (Service.mu) guards streams, buckets, members, pools
// and ledgers; the grant lock orders rounds. A stream's two goroutines
// (receive and deliver) touch the graph only through methods that take the
// service lock. The policy (what each bucket should get) lives in package
// plan as functions over values; this package owns exactness: ledgers,
// reservations, hand-overs and delivery.
package rlqs
