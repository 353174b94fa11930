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
// # Who owns what
//
// One goroutine, the owner (owner.go), owns streams, buckets, members,
// pools and ledgers: the state. Only the owner holds the state itself;
// other goroutines carry pointers into it (the buckets a round is due,
// the grants a message carries) but read or change what they point to
// only in a message to the owner (Service.do), whose answer they wait for:
//
//   - a stream's reader hands each report over (take) and reads on;
//   - a stream's sender notes each message that left, or did not
//     (delivered, undelivered);
//   - Run runs the rounds, one at a time, each phase that reads or changes
//     the state a message of its own;
//   - opening and closing a stream, a metrics scrape and the debug view
//     are messages too.
//
// The store is never called on the owner: a round takes values out of it
// (asks: keys, windows, rules, tokens), calls the store with them, and
// hands the outcomes back. A stream that closes meanwhile is one more
// message, taken before or after the round's next phase, never within
// one: that phase then finds its buckets gone, credits what the store
// counted for them and sends them nothing.
//
// A panic is caught in one place (catch): in a message, on the owner,
// which answers the sender with an error and goes on; or at the top of a
// goroutine the package starts (guard). Either way the stream it served
// ends with Internal and the process serves on.
//
// The policy (what each bucket should get) lives in package plan as
// functions over values: a round copies each pool's members into plan's
// values and takes back shares. This package owns exactness: ledgers,
// reservations, hand-overs and delivery.
//
// # A report, from the stream to the store and back
//
//  1. The stream's reader receives a report and hands it to the owner,
//     which takes it into the stream's buckets (state.report): a new
//     bucket, or one whose demand fell, is queued for a round at once.
//  2. Run takes the queue (or its push ticks) and runs a round. On the
//     owner, the round hands over and lends: grants whose messages have
//     left since the last round replace those before them, and what the
//     store holds past a window's need, or past what the reports say a
//     window used, is to be given back (handOvers, lends).
//  3. On the owner, the round plans: each pool's members are copied into
//     plan's values and plan.Fill shares the limit; each bucket gets a job,
//     a grant with each member's ledger tried with it (plan, jobFor,
//     sizedJob), and asks for what those ledgers need past what the store
//     holds.
//  4. Off the owner, the round reserves: the asks are counted in the
//     store, in small batches, give-backs first (reserve). A grant that
//     does not fit in full is shrunk on the owner to what the store can
//     hold, and counted again (shrink, recount).
//  5. On the owner, the round commits: what the store granted is credited
//     to the ledgers, and each stream is sent one message (commit), which
//     its sender sends within the delivery bound (deliver). What was
//     reserved for a message that never leaves stays counted until its
//     windows end, which errs toward admitting less, never more.
package rlqs
