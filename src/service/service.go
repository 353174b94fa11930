package service

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/logthrottle"
	"github.com/openrls/ratelimit/src/metrics"
)

// Configs yields the config snapshot to serve a request with; nil means none
// is loaded yet. *atomic.Pointer[config.Config] satisfies it.
type Configs interface {
	Load() *config.Config
}

// Options configures a Server. Store and Configs are required.
type Options struct {
	Store   limiter.Store
	Configs Configs
	// Now, when set, is the clock handed to the store with every batch.
	// Nil hands the zero instant, which tells each store to use its own
	// clock: Redis's TIME for the Redis store, so replicas whose clocks
	// disagree still share one window; the process clock for the memory
	// store. The wiring sets it only with SharedWindows (and tests, to
	// count at named instants).
	Now func() time.Time
	// SharedWindows counts fixed-window hits on the per-window counters
	// the Rate Limit Quota Service reserves its grants on
	// (RLQS_SHARED_COUNTERS), so that RLS clients and RLQS fleets share
	// one count. Windows are then named by Now, the clock the quota
	// service names its windows by, which it requires.
	SharedWindows bool
	// ShadowMode answers an overall OK whatever the outcome (SHADOW_MODE),
	// still counting; each descriptor's status says what was decided.
	ShadowMode bool
	// QuotaMode puts every descriptor in quota mode (QUOTA_MODE): a request
	// is rejected only when all its limited descriptors are past a limit.
	QuotaMode bool
	// StopIncrementWhenOverLimit makes a rejected request count nothing on
	// any of its descriptors (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT).
	StopIncrementWhenOverLimit bool
	// Limits bounds request sizes; zero fields take DefaultLimits' values.
	Limits Limits
	// Headers, when Enabled, adds RateLimit-* headers to every answer
	// (LIMIT_RESPONSE_HEADERS_ENABLED).
	Headers Headers
	// DynamicMetadata adds the decision to dynamic_metadata
	// (RESPONSE_DYNAMIC_METADATA).
	DynamicMetadata bool
	// DynamicMetadataRules adds, per descriptor, the rule, its source, how
	// it matched and the limit reported (RESPONSE_DYNAMIC_METADATA_RULES).
	DynamicMetadataRules bool
	// FailurePolicy is what to answer when the store fails, for descriptors
	// without their own failure_policy: "error" (the default: Unavailable,
	// and Envoy's failure_mode_deny decides), "allow", "deny" or "local".
	FailurePolicy config.FailurePolicy
	// Fallback is the store the "local" policy counts in while the main
	// store fails; required for "local".
	Fallback limiter.Store
	// Metrics receives every decision; nil means a private registry.
	Metrics *metrics.Registry
	// Limited, when set, hears of each descriptor answered OVER_LIMIT (not
	// in shadow mode), keyed by limitedKey, to find who is limited most.
	Limited Limited
	Logger  logrus.FieldLogger
}

// Limited counts limited descriptors; topk.Sketch satisfies it.
type Limited interface {
	Add(key string, n uint64)
}

// limitedKey joins what identifies a limited descriptor, each part
// length-prefixed so that any bytes in them stay apart; splitLimitedKey
// reads it back.
func limitedKey(domain, rule, values string) string {
	return strconv.Itoa(len(domain)) + ":" + domain + strconv.Itoa(len(rule)) + ":" + rule + values
}

// splitLimitedKey undoes limitedKey.
func splitLimitedKey(k string) (domain, rule, values string, ok bool) {
	take := func() (string, bool) {
		i := strings.IndexByte(k, ':')
		n, err := strconv.Atoi(k[:max(i, 0)])
		if i < 0 || err != nil || n < 0 || n > len(k)-i-1 {
			return "", false
		}
		part := k[i+1 : i+1+n]
		k = k[i+1+n:]
		return part, true
	}
	if domain, ok = take(); !ok {
		return "", "", "", false
	}
	if rule, ok = take(); !ok {
		return "", "", "", false
	}
	return domain, rule, k, true
}

// Server implements the RLS v3 RateLimitService. It is safe for concurrent
// use.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	opts                Options
	debug               func() bool // whether the logger is at debug level, now
	storeErrs, fullErrs *logthrottle.Throttle
	storeDown           atomic.Bool
}

// New returns a Server.
func New(opts Options) (*Server, error) {
	if opts.Store == nil || opts.Configs == nil {
		return nil, errors.New("service: Store and Configs are required")
	}
	if opts.SharedWindows && opts.Now == nil {
		return nil, errors.New("service: SharedWindows needs Now, the clock the quota service names its windows by")
	}
	if opts.Logger == nil {
		opts.Logger = logrus.New()
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.New(metrics.Options{})
	}
	if opts.FailurePolicy == "" {
		opts.FailurePolicy = config.PolicyError
	}
	if !opts.FailurePolicy.Valid() {
		return nil, fmt.Errorf("service: unknown failure policy %q", opts.FailurePolicy)
	}
	opts.Limits = opts.Limits.withDefaults()
	opts.Headers = opts.Headers.withDefaults()
	return &Server{opts: opts, debug: debugEnabled(opts.Logger),
		storeErrs: &logthrottle.Throttle{Every: logEvery}, fullErrs: &logthrottle.Throttle{Every: logEvery}}, nil
}

// ShouldRateLimit implements rlsv3.RateLimitServiceServer.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := ctx.Err(); err != nil {
		// Cancelled before it began (a client resetting its streams):
		// nothing to decide, nothing to count as a decision.
		s.opts.Metrics.Cancelled()
		return nil, status.FromContextError(err).Err()
	}
	start := time.Now()
	resp, err := s.shouldRateLimit(ctx, req)
	s.opts.Metrics.Request(outcomeLabel(resp, err), time.Since(start))
	return resp, err
}

func outcomeLabel(resp *rlsv3.RateLimitResponse, err error) string {
	switch {
	case err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
		return "over_limit"
	case err == nil:
		return "ok"
	case status.Code(err) == codes.InvalidArgument:
		return "invalid"
	case status.Code(err) == codes.Unavailable:
		return "unavailable"
	}
	return "error"
}

func (s *Server) shouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := validate(req, s.opts.Limits); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	cfg := s.opts.Configs.Load()
	if cfg == nil {
		return nil, status.Error(codes.Unavailable, "no rate limit configuration is loaded")
	}
	plan, err := cfg.Plan(req.GetDomain(), req.GetDescriptors(), req.GetHitsAddend())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	defer plan.Release()
	if plan.Domain == nil {
		s.opts.Metrics.DomainNotFound(req.GetDomain(), len(req.GetDescriptors()))
	}
	if len(plan.Hits) > s.opts.Limits.MaxKeys {
		return nil, status.Errorf(codes.InvalidArgument, "the descriptors match %d limits (store keys), at most %d allowed (REQUEST_MAX_KEYS)",
			len(plan.Hits), s.opts.Limits.MaxKeys)
	}
	if err := ctx.Err(); err != nil {
		// Cancelled while it was planned: the store is spared the work.
		return nil, status.FromContextError(err).Err()
	}
	var outcomes []limiter.Outcome
	stored := false
	if len(plan.Hits) > 0 {
		if outcomes, stored, err = s.count(ctx, plan); err != nil {
			return nil, err
		}
		s.record(req.GetDomain(), plan, outcomes)
	}
	if s.debug() {
		s.logDecisions(req, plan, outcomes)
	}
	var chosen [8]int
	dc := decide(plan, outcomes, chosen[:])
	resp := buildResponse(&dc, s.opts.ShadowMode, s.opts.QuotaMode)
	if s.opts.Limited != nil && !s.opts.ShadowMode {
		s.noteLimited(req, plan, resp)
	}
	if s.opts.ShadowMode && rejects(plan, outcomes, s.opts.QuotaMode) {
		s.opts.Metrics.ShadowOverride()
	}
	if s.opts.Headers.Enabled {
		resp.ResponseHeadersToAdd = s.opts.Headers.build(&dc, resp, s.opts.QuotaMode)
	}
	if s.opts.DynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, &dc, resp, s.opts.QuotaMode, s.opts.DynamicMetadataRules)
	}
	if stored {
		resp.DynamicMetadata = addSlotsTaken(resp.DynamicMetadata, plan, outcomes, s.opts.StopIncrementWhenOverLimit)
	}
	return resp, nil
}

// count asks the store about the plan's hits (advisory all under
// SHADOW_MODE), or, when it fails, answers by the failure policy; stored
// says the store answered.
func (s *Server) count(ctx context.Context, plan *config.Plan) (outs []limiter.Outcome, stored bool, err error) {
	if s.opts.ShadowMode {
		for i := range plan.Hits {
			plan.Hits[i].Advisory = true
		}
	}
	now := s.now()
	if s.opts.SharedWindows {
		windowKeys(plan.Hits, now)
	}
	began := time.Now()
	outcomes, err := s.opts.Store.Apply(ctx, limiter.Batch{Now: now, Hits: plan.Hits, AllOrNothing: s.opts.StopIncrementWhenOverLimit})
	s.opts.Metrics.Backend(time.Since(began), err)
	if err != nil {
		s.noteStoreError(err)
		outcomes, err = s.degrade(ctx, plan)
		return outcomes, false, err
	}
	if s.storeDown.Load() && s.storeDown.CompareAndSwap(true, false) {
		s.opts.Logger.Warn("rate limit store recovered")
	}
	return outcomes, true, nil
}

// windowKeys moves each fixed-window hit (not overdraft, not leased, not
// on a calendar) onto its window's own counter as of now, the one RLQS
// reserves its grants on. RLQS counts a calendar rule on epoch-aligned
// windows of its unit: its counts are not the calendar's.
func windowKeys(hits []limiter.Hit, now time.Time) {
	for i := range hits {
		h := &hits[i]
		if h.Rule.Algorithm == limiter.FixedWindow && !h.Rule.Overdraft && h.Rule.Lease == "" && h.Rule.Calendar == nil {
			w, _ := limiter.FixedWindowAt(now, h.Rule)
			h.Key = limiter.WindowKey(h.Key, w)
		}
	}
}

// now is the instant handed to the store: zero (the store's own clock)
// unless Options.Now is set.
func (s *Server) now() time.Time {
	if s.opts.Now == nil {
		return time.Time{}
	}
	return s.opts.Now()
}

// record counts every hit against its rule; refunds count apart.
func (s *Server) record(domain string, p *config.Plan, outs []limiter.Outcome) {
	for j, h := range p.Hits {
		ref := p.Refs[j]
		d := &p.Descs[ref.Desc]
		key, detailed := p.MetricKey(j)
		rule := s.opts.Metrics.Rule(domain, key, detailed, ref.Limit.MetricKey)
		if h.Refund {
			s.opts.Metrics.Refund(rule, h.Cost)
			continue
		}
		out := outs[j]
		used := h.Rule.Limit - min(out.Remaining, h.Rule.Limit)
		if out.Excess > 0 {
			// Counted though rejected: the count before it, from how far
			// it went past the limit.
			used = h.Rule.Limit + out.Excess - min(h.Cost, h.Rule.Limit+out.Excess)
		}
		// Under SHADOW_MODE the rule's own shadow_mode counter stays as
		// the reference keeps it: global_shadow_mode counts those.
		s.opts.Metrics.Hit(rule, metrics.Decision{Hits: h.Cost, Used: used,
			Limit: h.Rule.Limit, Allowed: out.Allowed, Shadow: d.Shadow(), Cached: out.Cached})
	}
}

// noteLimited tells Limited of each descriptor answered OVER_LIMIT by a
// rule not in shadow mode, its values as its counter key holds them.
func (s *Server) noteLimited(req *rlsv3.RateLimitRequest, p *config.Plan, resp *rlsv3.RateLimitResponse) {
	for i, st := range resp.GetStatuses() {
		d := &p.Descs[i]
		if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || d.Rule() == "" || d.Shadow() {
			continue
		}
		s.opts.Limited.Add(limitedKey(req.GetDomain(), d.Rule(), p.Values(i)), 1)
	}
}

// debugEnabled returns how to ask whether log is at debug level: a load of
// the logger's level, so that the per-decision lines cost nothing at other
// levels. A logger of another kind never logs them.
func debugEnabled(log logrus.FieldLogger) func() bool {
	switch l := log.(type) {
	case *logrus.Logger:
		return func() bool { return l.IsLevelEnabled(logrus.DebugLevel) }
	case *logrus.Entry:
		return func() bool { return l.Logger.IsLevelEnabled(logrus.DebugLevel) }
	}
	return func() bool { return false }
}

// logDecisions logs, at debug level, one line per descriptor: its entries,
// the rule that matched it (path, file and line), and per limit the store
// key and the decision. Values appear as the request sent them: debug
// logs are for investigating, not for keeping.
func (s *Server) logDecisions(req *rlsv3.RateLimitRequest, p *config.Plan, outs []limiter.Outcome) {
	for i, d := range req.GetDescriptors() {
		dp := &p.Descs[i]
		var entries []string
		for _, e := range d.GetEntries() {
			entries = append(entries, e.GetKey()+"="+e.GetValue())
		}
		f := logrus.Fields{"domain": req.GetDomain(), "descriptor": strings.Join(entries, ",")}
		f["rule"] = "none"
		if dp.Rule() != "" {
			f["rule"] = dp.Rule() + " (" + dp.Source() + ")"
		}
		if dp.Unlimited {
			f["limit"] = "unlimited"
		}
		var limits []string
		for j := dp.First; j < dp.First+dp.Count; j++ {
			decision := "OK"
			if !outs[j].Allowed {
				decision = "OVER_LIMIT"
			}
			limits = append(limits, fmt.Sprintf("%s key=%q %s remaining=%d", p.Refs[j].Limit, p.Hits[j].Key, decision, outs[j].Remaining))
		}
		if len(limits) > 0 {
			f["limits"] = strings.Join(limits, "; ")
		}
		s.opts.Logger.WithFields(f).Debug("decision")
	}
}

// noteStoreError logs a store failure: once when the store starts failing,
// then at most once per logEvery, with how many were held back.
func (s *Server) noteStoreError(err error) {
	if errors.Is(err, limiter.ErrFull) {
		// Not an outage: the embedded store has no room for a new counter
		// while the others stay live. Logged at most once per logEvery.
		if n, ok := s.fullErrs.Due(time.Now()); ok {
			s.opts.Logger.WithError(err).WithField("suppressed", n).Warn("new counters answered by failure policy")
		}
		return
	}
	if s.storeDown.CompareAndSwap(false, true) {
		s.opts.Logger.WithError(err).Error("rate limit store failing; answering by failure policy")
	}
	if n, ok := s.storeErrs.Due(time.Now()); ok {
		s.opts.Logger.WithError(err).WithField("suppressed", n).Error("rate limit store failed")
	}
}

// degrade answers a plan whose store call failed, hit by hit, by the
// failure policy of each hit's descriptor. Any hit under "error" makes the
// whole answer Unavailable: Envoy's failure_mode_deny then decides.
func (s *Server) degrade(ctx context.Context, p *config.Plan) ([]limiter.Outcome, error) {
	if ctx.Err() != nil {
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	// The cause (addresses, Redis's own words) goes to the log, not to a
	// client that may be anyone able to reach the port.
	unavailable := status.Error(codes.Unavailable, "rate limit store unavailable")
	outs := make([]limiter.Outcome, len(p.Hits))
	var local []int
	for j, ref := range p.Refs {
		policy := s.opts.FailurePolicy
		if own := p.Descs[ref.Desc].FailurePolicy(); own != "" {
			policy = own
		}
		s.opts.Metrics.FailurePolicy(string(policy))
		switch policy {
		case config.PolicyAllow:
			outs[j] = limiter.Outcome{Allowed: true, Remaining: p.Hits[j].Rule.Limit}
		case config.PolicyDeny:
			outs[j] = limiter.Outcome{}
		case config.PolicyLocal:
			local = append(local, j)
		default:
			return nil, unavailable
		}
	}
	if len(local) == 0 {
		return outs, nil
	}
	if s.opts.Fallback == nil {
		return nil, unavailable
	}
	hits := make([]limiter.Hit, len(local))
	for i, j := range local {
		hits[i] = p.Hits[j]
	}
	got, err := s.opts.Fallback.Apply(ctx, limiter.Batch{Now: s.now(), Hits: hits, AllOrNothing: s.opts.StopIncrementWhenOverLimit})
	if err != nil {
		return nil, unavailable
	}
	for i, j := range local {
		outs[j] = got[i]
	}
	return outs, nil
}

// logEvery spaces the repeats of a store failure in the log.
const logEvery = 5 * time.Second
