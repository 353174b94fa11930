package service

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
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
	// Now is the clock handed to the store; nil means time.Now. The Redis
	// store ignores it in production and reads Redis's clock instead.
	Now func() time.Time
	// ShadowMode answers OK whatever the outcome (SHADOW_MODE), still counting.
	ShadowMode bool
	// StopIncrementWhenOverLimit makes a rejected request count nothing on
	// any of its descriptors (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT).
	StopIncrementWhenOverLimit bool
	// Limits bounds request sizes; zero fields take DefaultLimits' values.
	Limits Limits
	Logger logrus.FieldLogger
}

// Server implements the RLS v3 RateLimitService. It is safe for concurrent
// use.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	opts      Options
	storeErrs burstLog
}

// New returns a Server.
func New(opts Options) (*Server, error) {
	if opts.Store == nil || opts.Configs == nil {
		return nil, errors.New("service: Store and Configs are required")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = logrus.New()
	}
	opts.Limits = opts.Limits.withDefaults()
	return &Server{opts: opts}, nil
}

// ShouldRateLimit implements rlsv3.RateLimitServiceServer.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
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
	var outcomes []limiter.Outcome
	if len(plan.Hits) > 0 {
		if s.opts.ShadowMode {
			for i := range plan.Hits {
				plan.Hits[i].Advisory = true
			}
		}
		outcomes, err = s.opts.Store.Apply(ctx, limiter.Batch{Now: s.opts.Now(), Hits: plan.Hits, AllOrNothing: s.opts.StopIncrementWhenOverLimit})
		if err != nil {
			return nil, s.storeError(ctx, err)
		}
	}
	return buildResponse(plan, outcomes, s.opts.ShadowMode), nil
}

// storeError maps a store failure to a status, logging once per burst.
func (s *Server) storeError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	if n, ok := s.storeErrs.due(time.Now()); ok {
		s.opts.Logger.WithError(err).WithField("suppressed", n).Error("rate limit store failed")
	}
	return status.Errorf(codes.Unavailable, "rate limit store unavailable: %v", err)
}

// burstLog lets one line through per interval and counts the rest.
type burstLog struct {
	next       atomic.Int64
	suppressed atomic.Int64
}

func (b *burstLog) due(now time.Time) (suppressed int64, ok bool) {
	next := b.next.Load()
	if now.UnixNano() < next || !b.next.CompareAndSwap(next, now.Add(5*time.Second).UnixNano()) {
		b.suppressed.Add(1)
		return 0, false
	}
	return b.suppressed.Swap(0), true
}
