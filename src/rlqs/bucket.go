package rlqs

import (
	"sort"
	"strconv"
	"strings"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/rlqs/plan"
)

// kind is what a bucket is answered.
type kind uint8

const (
	kindNone      kind = iota // nothing sent yet
	kindAllow                 // ALLOW_ALL: unlimited
	kindUnmatched             // ALLOW_ALL: no rule (or an unknown domain)
	kindShadow                // ALLOW_ALL: shadow or quota mode, usage counted in metrics
	kindDeny                  // DENY_ALL: a limit of 0
	kindLimited               // a token bucket from the limit's pools
)

var kindNames = [...]string{"none", "allow_all", "unmatched", "shadow", "deny_all", "token_bucket"}

func (k kind) String() string { return kindNames[k] }

// bucket is one bucket id of one stream.
type bucket struct {
	s       *stream
	id      *rlqsv3.BucketId // as reported, echoed in every action
	idBytes int              // its keys' and values' bytes
	values  map[string]string
	cfg     *config.Config // the config kind and members come from
	kind    kind
	// members are the bucket's shares, one per limit of its rule.
	members []*member

	// est reads the bucket's demand from its reports; demand is its
	// rate (requests per second, +Inf until measured), counted the
	// requests reported since lastReport.
	est         plan.Demand
	demand      float64
	counted     uint64
	lastReport  time.Time
	lastTraffic time.Time
	gone        bool
	lending     bool // in the service's lenders, for the next round
	queued      bool // in the state's atOnce, for Run's next round

	// What the Envoy was last sent.
	sent     time.Time
	sentKind kind
	sentQ    uint32
	sentF    int64
	sentCap  uint64
	// lapsed is set when an assignment may not have arrived: the next token
	// bucket may find the Envoy's bucket expired, and so start full.
	lapsed bool
}

// member is a bucket's share of one limit.
type member struct {
	b      *bucket
	p      *pool
	l      *ledger
	target float64 // tokens per second, from the pool's last fill
	// holds is whether the last fill gave it a share: a token bucket of
	// target, and the 0.9 of a token per period every grant carries (see
	// plan.ExtraPerPeriod), which a target of 0 still has.
	holds  bool
	served int // the rounds that sent it a token bucket
	// burst is the capacity its pool's room to spare pays for (see
	// plan.Fill), in force from this fill; nextBurst the next fill's.
	burst, nextBurst uint64
}

// pool is one limit's counter, shared by every bucket (of every stream on
// this replica) that maps onto it.
type pool struct {
	key     string       // the rule's counter key; limiter.WindowKey names its windows
	rule    limiter.Rule // a fixed window, as reservations count
	metric  string
	members map[*member]struct{}
	// frac is this replica's part of the limit, by its part of the demand
	// all replicas published (exchangeDemand); 1 until known.
	frac float64
	// published is what this replica added to the pool's demand counters
	// of its last two push windows, the older first.
	published [2]published
}

// published is what a replica added to one push window's demand counter.
type published struct {
	w int64
	n uint64
}

// bucketKey is a canonical string of an unordered bucket id.
func bucketKey(values map[string]string) string {
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(strconv.Itoa(len(k)))
		b.WriteByte(':')
		b.WriteString(k)
		b.WriteString(strconv.Itoa(len(values[k])))
		b.WriteByte(':')
		b.WriteString(values[k])
	}
	return b.String()
}

// classify plans the bucket's request on cfg and says what it gets: its
// kind and, for a limited bucket, one reservation pool per limit (the
// rule's counter key, and the rule as a fixed window of its limit per
// period). Reservations are counted window by window, on
// limiter.WindowKey's names: a reservation made ahead for a later window
// must not end the current one, which a key holding one window would. RLS
// hits share those counters only under RLQS_SHARED_COUNTERS.
func classify(cfg *config.Config, domain string, values map[string]string) (kind, []poolSpec) {
	p, err := cfg.PlanBucket(domain, values)
	if err != nil {
		return kindUnmatched, nil
	}
	defer p.Release()
	if p.Domain == nil || len(p.Descs) == 0 {
		return kindUnmatched, nil
	}
	d := &p.Descs[0]
	switch {
	case d.Node == nil:
		return kindUnmatched, nil
	case d.Count == 0 && d.Unlimited:
		return kindAllow, nil
	case d.Count == 0:
		return kindUnmatched, nil
	case d.Shadow() || d.Quota():
		return kindShadow, nil
	}
	specs := make([]poolSpec, 0, d.Count)
	for i := d.First; i < d.First+d.Count; i++ {
		h := p.Hits[i]
		if h.Rule.Algorithm == limiter.Concurrency {
			// Work in flight needs each request's end, which an RLQS
			// client never reports: not limited here.
			continue
		}
		if h.Rule.Limit == 0 {
			return kindDeny, nil
		}
		specs = append(specs, poolSpec{key: h.Key, metric: p.Refs[i].Limit.MetricKey,
			rule: limiter.Rule{Algorithm: limiter.FixedWindow, Limit: h.Rule.Limit, Period: h.Rule.Period}})
	}
	if len(specs) == 0 {
		return kindUnmatched, nil
	}
	return kindLimited, specs
}

type poolSpec struct {
	key, metric string
	rule        limiter.Rule
}

// reported is a report's requests, allowed and denied: a sum that
// saturates, since a client may report numbers near 2^64.
func reported(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) uint64 {
	return plan.SatAdd(u.GetNumRequestsAllowed(), u.GetNumRequestsDenied())
}

// noteUsage takes one report of the bucket's usage, received at now, and
// reports whether its demand was measured for the first time or fell past
// chance (plan.Demand.Observe): its share then frees room, worth a round
// at once. A rise waits for the next push: the room it needs is mostly
// held by others until their falls hand it over, and answered at once it
// cost more store calls a report (BenchmarkRLQS).
func (b *bucket) noteUsage(u *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage, now time.Time) (changed bool) {
	n := reported(u)
	b.counted = plan.SatAdd(b.counted, n)
	if n > 0 {
		b.lastTraffic = now
	}
	// Envoy's time_elapsed is whole seconds and 0 on a new bucket: the
	// server's own clock measures. Reports closer together than
	// plan.MinInterval (a reconnect's) are summed into the next.
	if dt := now.Sub(b.lastReport); dt >= plan.MinInterval {
		changed = b.est.Observe(b.counted, dt)
		b.demand, b.counted, b.lastReport = b.est.Rate(), 0, now
	}
	return changed
}
