package plan

import (
	"math"
	"time"
)

// capacity is the token-bucket capacity of a grant of q tokens per
// period. Envoy caps a bucket at its capacity, so with one token a refill
// that comes due while a token waits is lost; two keep the refill for
// traffic that uses it. But every bucket costs its capacity in every
// window (the tokens it may carry in), which a limit shared by many
// buckets cannot spare: a grant of few tokens per period gets one.
func capacity(q uint32) uint64 {
	if q >= 8 {
		return PlainCapacity
	}
	return 1
}

// PlainCapacity is the most capacity gives; a larger one is a burst (see
// planBursts).
const PlainCapacity = 2

// ShrinkBelow is the grant, in tokens per period, below which a capacity
// of 2 shrinks to 1: half of where capacity gives 2, so that it does not
// flap.
const ShrinkBelow = 4

// StartCapacity is the capacity a demand (requests per second) calls for
// on a period of f seconds: capacity of what it asks (all it can get while
// unmeasured), or burst, the capacity its pools pay for, where that is
// more.
func StartCapacity(demand float64, f int64, burst uint64) uint64 {
	return max(capacity(uint32(min(demand*float64(f), math.MaxUint32))), burst)
}

// CapacityFor is the capacity of a bucket's next grant of q tokens per
// period, given the capacity it was last sent (sentCap, 0 for none) and
// StartCapacity's (start). A token bucket that starts full anyway
// (startsFull: a first one, or one after DENY_ALL or a lapse) takes
// capacity(q), or on the round's first try (mayGrow) start. Otherwise a
// capacity that grows costs a reset in its window (the Envoy rescales the
// tokens it holds), which a full pool cannot spare unless its fill set the
// growth aside: so the capacity grows only where mayGrow (cut's smaller
// grants keep the capacity held), to what the grant or the demand calls
// for, and shrinks only below ShrinkBelow tokens per period, so that it
// does not flap; a burst its pools no longer pay for ends.
func CapacityFor(sentCap uint64, q uint32, start uint64, startsFull, mayGrow bool) uint64 {
	switch {
	case (startsFull || sentCap == 0) && mayGrow:
		return max(capacity(q), start)
	case startsFull || sentCap == 0:
		return capacity(q)
	case sentCap > PlainCapacity && sentCap > max(capacity(q), start):
		return max(capacity(q), start)
	case q < ShrinkBelow:
		return 1
	case mayGrow:
		return max(sentCap, capacity(q), start)
	}
	return sentCap
}

// FillPeriods is how many limit periods a token bucket's fill interval
// spans: a grant of q tokens per period is sent as q×FillPeriods +
// FillPeriods−1 tokens every FillPeriods periods, q + 0.9 a period. It
// costs what q alone does: a window's need counts whole requests, and a
// bucket refilled at q + 0.9 a period admits no more whole requests in a
// window than one refilled at q, but it is full again a tenth of a period
// sooner, so a bucket asking exactly its grant does not lose every other
// request to a token a moment short of full. Pinned by
// TestEveryGrantCarriesNineTenths and TestEnvoyTakesNoGrantForAnother.
const FillPeriods = 10

// ExtraPerPeriod is what every grant refills beyond its tokens per period.
const ExtraPerPeriod = float64(FillPeriods-1) / FillPeriods

// TokenBucket is what a grant of q tokens per period of f seconds sends:
// tokens per fill, the fill interval, and the rate in tokens per second
// (see FillPeriods). A grant too large to carry the extra goes as it is.
//
// The fill interval's nanoseconds name the period (f of them). Envoy 1.40
// refills at tokens per fill over the interval's whole seconds, so they
// change no rate, but it takes a token bucket whose capacity, tokens per
// fill and nanoseconds equal those of the one it holds for that one, and
// keeps its limiter, old rate and all, under the new TTL. An Envoy keeps
// its assignments when it reconnects, to another replica or after a
// restart, and a reload may change a rule's period: a grant for another
// period, or from a build that sent whole seconds (nanoseconds 0), would
// otherwise be taken for the one in force, and renewing it would keep an
// old rate refilling that nothing reserves. (A client that reads the
// nanoseconds refills a billionth slower: never more than is held.)
func TokenBucket(q uint32, f int64) (perFill uint32, interval time.Duration, rate float64) {
	name := time.Duration(min(f, 999_999_999))
	if q > (math.MaxUint32-(FillPeriods-1))/FillPeriods {
		return q, time.Duration(f)*time.Second + name, float64(q) / float64(f)
	}
	perFill = q*FillPeriods + FillPeriods - 1
	return perFill, time.Duration(f*FillPeriods)*time.Second + name, float64(perFill) / float64(f*FillPeriods)
}
