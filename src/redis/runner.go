package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// lastingRefusal reports whether FUNCTION LOAD's error says it will never
// work here: a command Redis does not know (before 7), one the ACL denies,
// or a library it cannot register. Anything else (LOADING, READONLY,
// CLUSTERDOWN, "max number of clients", the network) may pass, and the
// load is tried again.
func lastingRefusal(err error) bool {
	var reply goredis.Error
	if !errors.As(err, &reply) {
		return false
	}
	msg := reply.Error()
	if strings.HasPrefix(msg, "NOPERM") {
		return true
	}
	for _, s := range []string{"unknown command", "unknown subcommand", "Error registering functions", "Error compiling"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
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

// fcallRefused reports an FCALL that Redis will never run for this user:
// the ACL denies the command itself (not a key, which the script would
// meet too), or Redis does not know it.
func fcallRefused(err error) bool {
	var reply goredis.Error
	if !errors.As(err, &reply) {
		return false
	}
	msg := strings.ToLower(reply.Error())
	return strings.HasPrefix(msg, "noperm") && strings.Contains(msg, "'fcall'") || strings.Contains(msg, "unknown command")
}

// functionMissing reports an FCALL that did not run because the library
// is not loaded on that node (a restart without persistence, FUNCTION
// FLUSH, a new Cluster master).
func functionMissing(err error) bool {
	return goredis.HasErrorPrefix(err, "Function not found") // go-redis drops the "ERR "
}

// send sends calls in one round trip and sets every call's reply and err:
// the only place this package sends batch.lua, batched or not. One call is
// one FCALL or EVALSHA; several are, with merge, one call holding them all
// (merged), else a pipeline (Cluster: go-redis sends one per node). Plain
// calls (plain.go) make it a transaction, with their commands and a TIME.
// Calls that found the function missing, or FCALL refused for good (an ACL that allows
// FUNCTION LOAD but not FCALL), did not run: they run again as the script,
// whose answers (or errors) are theirs; a missing library is loaded again
// when due, a refused FCALL is not tried again.
func (r *runner) send(ctx context.Context, merge bool, batch []*call) {
	r.loadIfDue(ctx)
	fn := r.ready.Load()
	var scripted, plain []*call
	for _, c := range batch {
		if c.plain != nil {
			plain = append(plain, c)
		} else {
			scripted = append(scripted, c)
		}
	}
	if len(plain) == 0 {
		sendScripted(ctx, r.client, merge, fn, scripted)
	} else {
		sendPipelined(ctx, r.client, merge, fn, scripted, plain)
	}
	var missed []*call
	for _, c := range scripted {
		switch {
		case c.err == nil || !fn:
		case functionMissing(c.err):
			missed = append(missed, c)
			r.ready.Store(false)
		case fcallRefused(c.err):
			missed = append(missed, c)
			err := fmt.Errorf("redis: FCALL: %w", c.err)
			r.refused.Store(&err)
			r.ready.Store(false)
		}
	}
	if len(missed) > 0 {
		sendScripted(ctx, r.client, merge, false, missed)
	}
}

// sendScripted runs the calls as the function (fn) or the script. As the script,
// one call is an EVALSHA that go-redis turns into an EVAL on NOSCRIPT; in a
// pipeline, one that found the script flushed (a restart, SCRIPT FLUSH, a
// failover) did not run, so running it again counts it once.
func sendScripted(ctx context.Context, client goredis.UniversalClient, merge, fn bool, batch []*call) {
	if len(batch) == 1 {
		c := batch[0]
		c.reply, c.err = sendOne(ctx, client, fn, c.keys, c.arg).Result()
		return
	}
	if merge {
		keys, arg := merged(batch)
		reply, err := sendOne(ctx, client, fn, keys, arg).Result()
		splitMerged(reply, err, batch)
		return
	}
	sendPipelined(ctx, client, false, fn, batch, nil)
}

// sendPipelined runs the plain calls (plain.go) in one transaction with a
// TIME, and the scripted calls (merged into one with merge) in it too, so
// that the batch is still one round trip. A scripted call that found the
// script flushed runs again as the script (see sendScripted).
func sendPipelined(ctx context.Context, client goredis.UniversalClient, merge, fn bool, scripted, plain []*call) {
	queue := func(p goredis.Pipeliner, keys []string, arg []byte) *goredis.Cmd {
		if fn {
			return p.FCall(ctx, fnName, keys, arg)
		}
		return batchScript.EvalSha(ctx, p, keys, arg)
	}
	merge = merge && len(scripted) > 1
	var one *goredis.Cmd // the merged call
	var at *goredis.TimeCmd
	cmds := make([]*goredis.Cmd, len(scripted))
	counts := make([][]*goredis.IntCmd, len(plain))
	queueAll := func(p goredis.Pipeliner) error {
		if len(plain) > 0 {
			at = p.Time(ctx)
		}
		for i, c := range plain {
			counts[i] = queuePlain(ctx, p, c)
		}
		if merge {
			keys, arg := merged(scripted)
			one = queue(p, keys, arg)
		} else {
			for i, c := range scripted {
				cmds[i] = queue(p, c.keys, c.arg)
			}
		}
		return nil
	}
	if len(plain) > 0 {
		_, err := client.TxPipelined(ctx, queueAll)
		plainReplies(plain, counts, at)
		if len(scripted) > 0 && (goredis.HasErrorPrefix(err, "EXECABORT") || plainRefused(err)) {
			// Redis refused a command as it was queued (an ACL, maxmemory):
			// nothing ran. Or it refused the MULTI (see plainRefused): each
			// ran alone. Either way the scripted calls run again, alone.
			sendPipelined(ctx, client, merge, fn, scripted, nil)
			return
		}
	} else {
		_, _ = client.Pipelined(ctx, queueAll)
	}
	if merge {
		reply, err := one.Result()
		if !fn && goredis.HasErrorPrefix(err, "NOSCRIPT") {
			keys, arg := merged(scripted)
			reply, err = batchScript.Run(ctx, client, keys, arg).Result()
		}
		splitMerged(reply, err, scripted)
		return
	}
	for i, c := range scripted {
		c.reply, c.err = cmds[i].Result()
		if !fn && c.err != nil && goredis.HasErrorPrefix(c.err, "NOSCRIPT") {
			c.reply, c.err = batchScript.Run(ctx, client, c.keys, c.arg).Result()
		}
	}
}

// sendOne sends one call: an FCALL, or an EVALSHA that go-redis turns into an
// EVAL on NOSCRIPT.
func sendOne(ctx context.Context, client goredis.UniversalClient, fn bool, keys []string, arg []byte) *goredis.Cmd {
	if fn {
		return client.FCall(ctx, fnName, keys, arg)
	}
	return batchScript.Run(ctx, client, keys, arg)
}
