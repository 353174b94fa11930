package redis

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// runner sends the store's calls of batch(keys, args) (batch.lua): as a
// Redis function (FCALL) once its library is loaded, else as a script
// (EVALSHA). A function's code is created once, when its library loads;
// a script's local functions are created on every call, which costs Redis
// more than the rest of a one-decision call (docs/performance.md). Redis
// before 7, or an ACL that refuses FUNCTION, leaves the script.
type runner struct {
	client goredis.UniversalClient

	ready atomic.Bool // the library was loaded on every node, and not found missing since
	// refused is FUNCTION LOAD's lasting error, if Redis gave one: then
	// the script only.
	refused atomic.Pointer[error]
	// loadMu is held by the one call that loads the library; lastLoad is
	// when a load was last tried, so that a Redis that keeps losing it is
	// asked at most once per loadEvery.
	loadMu   sync.Mutex
	lastLoad time.Time
}

// loadEvery is how often a missing library is loaded again at most.
const loadEvery = time.Second

func newRunner(client goredis.UniversalClient) *runner {
	return &runner{client: client}
}

// load loads the function library on every node that takes writes (each
// Cluster master; replicas get it by replication) and the script, and
// marks the function ready if that worked.
func (r *runner) load(ctx context.Context) error {
	r.loadMu.Lock()
	defer r.loadMu.Unlock()
	return r.loadLocked(ctx)
}

// loadLocked is load, loadMu held.
func (r *runner) loadLocked(ctx context.Context) error {
	r.lastLoad = time.Now()
	if err := batchScript.Load(ctx, r.client).Err(); err != nil {
		return fmt.Errorf("redis: load script: %w", err)
	}
	if r.refused.Load() != nil {
		return nil
	}
	loadOn := func(ctx context.Context, c goredis.Cmdable) error { return c.FunctionLoadReplace(ctx, libSrc).Err() }
	var err error
	if cc, ok := r.client.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error { return loadOn(ctx, n) })
	} else {
		err = loadOn(ctx, r.client)
	}
	switch {
	case err == nil:
		r.ready.Store(true)
	case lastingRefusal(err):
		// Redis before 7 ("unknown command"), an ACL without FUNCTION
		// (NOPERM): the script serves, as well as it always did.
		err = fmt.Errorf("redis: FUNCTION LOAD: %w", err)
		r.refused.Store(&err)
	default:
		return fmt.Errorf("redis: load function library: %w", err)
	}
	return nil
}

// loadIfDue loads the library when it is not ready, was not refused, and
// no load was tried within loadEvery: the caller pays a round trip, once.
func (r *runner) loadIfDue(ctx context.Context) {
	if r.ready.Load() || r.refused.Load() != nil || !r.loadMu.TryLock() {
		return
	}
	defer r.loadMu.Unlock()
	if time.Since(r.lastLoad) >= loadEvery {
		_ = r.loadLocked(ctx) // an error leaves the script, until the next try
	}
}

// send sends calls in one round trip and sets every call's answer: the
// only place this package sends a decision, batched or not. What goes
// (see roundTrip) is each call's route (route.go), which the store chose;
// with merge, the calls of batch.lua go as one call holding them all.
// Calls of batch.lua that found the function missing, or FCALL refused
// for good (an ACL that allows FUNCTION LOAD but not FCALL), did not run:
// they run again as the script, whose answers (or errors) are theirs; a
// missing library is loaded again when due, a refused FCALL is not tried
// again.
func (r *runner) send(ctx context.Context, merge bool, batch []*call) {
	r.loadIfDue(ctx)
	fn := r.ready.Load()
	if len(batch) == 1 && !batch[0].route.transactional() {
		batch[0].route.sendAlone(ctx, r.client, fn) // the common call, without a slice for it
	} else {
		routes := make([]route, len(batch))
		for i, c := range batch {
			routes[i] = c.route
		}
		roundTrip(ctx, r.client, fn, mergeScripts(routes, merge))
	}
	if !fn {
		return
	}
	var missed []route
	for _, c := range batch {
		if c.route.failure() == nil {
			continue
		}
		for _, s := range c.route.scripts() {
			switch {
			case functionMissing(s.err):
				missed = append(missed, s)
				r.ready.Store(false)
			case fcallRefused(s.err):
				missed = append(missed, s)
				err := fmt.Errorf("redis: FCALL: %w", s.err)
				r.refused.Store(&err)
				r.ready.Store(false)
			}
		}
	}
	if len(missed) > 0 {
		roundTrip(ctx, r.client, false, mergeScripts(missed, merge))
	}
}
