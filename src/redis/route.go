package redis

import (
	"context"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/openrls/ratelimit/src/limiter"
)

// Routes: the ways a decision's call reaches Redis. Store.route chooses
// one per call: batch.lua's (scriptRoute), which decides any hit in any
// mode, or plain commands (plainRoute, plain.go), which decide the common
// fixed window for half the CPU. Each owns its commands, its reply and how
// that reply answers the decision; roundTrip sends any mix of them in one
// round trip by asking each what it needs, never which it is.

// route is one call's way to Redis.
type route interface {
	// transactional reports whether the route's commands must run in one
	// MULTI/EXEC with a TIME, as the plain route's must (its answer reads
	// Redis's clock at the instant of its counts).
	transactional() bool
	// queue queues the route's commands on p: batch.lua as the function
	// when fn, else as the script.
	queue(ctx context.Context, p goredis.Pipeliner, fn bool)
	// read takes the replies of what queue queued, once t has run.
	read(ctx context.Context, client goredis.UniversalClient, fn bool, t *trip)
	// sendAlone sends the route's commands as the whole round trip, with
	// no pipeline around them.
	sendAlone(ctx context.Context, client goredis.UniversalClient, fn bool)
	// failure is why the route has no answer (Redis's error, or the
	// round trip's), or nil.
	failure() error
	// refusedForGood reports that err (its failure) says Redis will never
	// run the route's commands for this user: the function, which it
	// allows, serves from then on.
	refusedForGood(err error) bool
	// answer puts the answers to g's hits into outs (by g.idx), and
	// returns the hits it cannot answer, to be decided again by the
	// function, and what to mend after (see repair).
	answer(g *group, outs []limiter.Outcome, repairs *[]repair) (again *group, err error)
	// scripts are the route's calls of batch.lua, which the runner sends
	// again as the script when the function was missing or refused.
	scripts() []*scriptRoute
}

// trip is one round trip as the routes in it see it: the transaction's
// TIME, when one ran, and its error.
type trip struct {
	at  *goredis.TimeCmd
	err error
}

// roundTrip sends routes in one round trip and has each read its replies:
// one route alone by itself, several in a pipeline, or, when one of them
// is transactional, all in one transaction with a TIME. A transaction
// that did not run as one (txAborted) leaves the routes that need none to
// run again, in a pipeline of their own: nothing of them ran, or, where
// the MULTI was refused, each ran alone and runs again (an ACL changed
// under a running service rejects a little sooner, never admits more).
func roundTrip(ctx context.Context, client goredis.UniversalClient, fn bool, routes []route) {
	tx := false
	for _, rt := range routes {
		tx = tx || rt.transactional()
	}
	if len(routes) == 1 && !tx {
		routes[0].sendAlone(ctx, client, fn)
		return
	}
	t := &trip{}
	queueAll := func(p goredis.Pipeliner) error {
		if tx {
			t.at = p.Time(ctx)
		}
		for _, rt := range routes {
			rt.queue(ctx, p, fn)
		}
		return nil
	}
	if tx {
		_, t.err = client.TxPipelined(ctx, queueAll)
	} else {
		_, _ = client.Pipelined(ctx, queueAll)
	}
	var again []route
	for _, rt := range routes {
		if tx && !rt.transactional() && txAborted(t.err) {
			again = append(again, rt)
			continue
		}
		rt.read(ctx, client, fn, t)
	}
	if len(again) > 0 {
		roundTrip(ctx, client, fn, again)
	}
}

// scriptRoute is a decision's call of batch.lua: its keys and its
// argument (scriptArg), and once sent, its reply.
type scriptRoute struct {
	keys  []string
	arg   []byte
	cmd   *goredis.Cmd // as queued
	reply any
	err   error
}

func (s *scriptRoute) transactional() bool { return false }

func (s *scriptRoute) queue(ctx context.Context, p goredis.Pipeliner, fn bool) {
	s.cmd = queueScript(ctx, p, fn, s.keys, s.arg)
}

// read takes the reply; a call of the script that found it flushed did
// not run, and runs again as EVAL (counted once).
func (s *scriptRoute) read(ctx context.Context, client goredis.UniversalClient, fn bool, _ *trip) {
	s.reply, s.err = s.cmd.Result()
	if !fn && scriptFlushed(s.err) {
		s.reply, s.err = batchScript.Run(ctx, client, s.keys, s.arg).Result()
	}
}

func (s *scriptRoute) sendAlone(ctx context.Context, client goredis.UniversalClient, fn bool) {
	s.reply, s.err = sendOne(ctx, client, fn, s.keys, s.arg).Result()
}

func (s *scriptRoute) failure() error                { return s.err }
func (s *scriptRoute) refusedForGood(error) bool     { return false }
func (s *scriptRoute) scripts() []*scriptRoute       { return []*scriptRoute{s} }
func (s *scriptRoute) setReply(reply any, err error) { s.reply, s.err = reply, err }

func (s *scriptRoute) answer(g *group, outs []limiter.Outcome, _ *[]repair) (*group, error) {
	got, err := parseOutcomes(s.reply, len(g.hits), g.grants)
	if err != nil {
		return nil, err
	}
	for j, i := range g.idx {
		outs[i] = got[j]
	}
	return nil, nil
}

// mergedScripts is several calls of batch.lua sent as one, decision after
// decision: one string for Redis to read and Lua to make, not one per
// decision. The runner makes it (mergeScripts); its parts get their
// replies from its own (splitMerged).
type mergedScripts struct {
	parts []*scriptRoute
	keys  []string
	arg   []byte
	cmd   *goredis.Cmd
}

// mergeScripts is routes with, when merge, their calls of batch.lua
// merged into one (where there are several).
func mergeScripts(routes []route, merge bool) []route {
	n := 0
	for _, rt := range routes {
		if _, ok := rt.(*scriptRoute); ok {
			n++
		}
	}
	if !merge || n < 2 {
		return routes
	}
	parts := make([]*scriptRoute, 0, n)
	out := make([]route, 0, len(routes)-n+1)
	for _, rt := range routes {
		if s, ok := rt.(*scriptRoute); ok {
			parts = append(parts, s)
		} else {
			out = append(out, rt)
		}
	}
	m := &mergedScripts{parts: parts}
	for _, s := range parts {
		m.keys = append(m.keys, s.keys...)
		m.arg = append(m.arg, s.arg...)
	}
	return append(out, m)
}

func (m *mergedScripts) transactional() bool { return false }

func (m *mergedScripts) queue(ctx context.Context, p goredis.Pipeliner, fn bool) {
	m.cmd = queueScript(ctx, p, fn, m.keys, m.arg)
}

func (m *mergedScripts) read(ctx context.Context, client goredis.UniversalClient, fn bool, _ *trip) {
	reply, err := m.cmd.Result()
	if !fn && scriptFlushed(err) {
		reply, err = batchScript.Run(ctx, client, m.keys, m.arg).Result()
	}
	splitMerged(reply, err, m.parts)
}

func (m *mergedScripts) sendAlone(ctx context.Context, client goredis.UniversalClient, fn bool) {
	reply, err := sendOne(ctx, client, fn, m.keys, m.arg).Result()
	splitMerged(reply, err, m.parts)
}

// A merged call answers through its parts: the runner hands those back
// to their calls.
func (m *mergedScripts) failure() error            { return nil }
func (m *mergedScripts) refusedForGood(error) bool { return false }
func (m *mergedScripts) scripts() []*scriptRoute   { return m.parts }

func (m *mergedScripts) answer(*group, []limiter.Outcome, *[]repair) (*group, error) {
	return nil, fmt.Errorf("redis: a merged call answers through its parts")
}

// splitMerged splits the reply (or err) of a merged call among its parts,
// decision after decision (see answerBytes).
func splitMerged(reply any, err error, parts []*scriptRoute) {
	packed, ok := reply.(string)
	if err == nil && !ok {
		err = fmt.Errorf("redis: unexpected script reply %T for %d decisions", reply, len(parts))
	}
	off := 0
	for _, s := range parts {
		if err == nil {
			n, whole := answerBytes(packed[off:], len(s.keys))
			if !whole {
				err = fmt.Errorf("redis: unexpected script reply (%d bytes) for %d decisions", len(packed), len(parts))
			} else {
				// A call run again (as the script, after the function was
				// found missing) drops the error of its first run.
				s.setReply(packed[off:off+n], nil)
				off += n
				continue
			}
		}
		s.setReply(nil, err)
	}
	if err == nil && off != len(packed) {
		err = fmt.Errorf("redis: unexpected script reply (%d bytes) for %d decisions", len(packed), len(parts))
		for _, s := range parts {
			s.setReply(nil, err)
		}
	}
}

// queueScript queues a call of batch.lua on p: an FCALL, or an EVALSHA.
func queueScript(ctx context.Context, p goredis.Pipeliner, fn bool, keys []string, arg []byte) *goredis.Cmd {
	if fn {
		return p.FCall(ctx, fnName, keys, arg)
	}
	return batchScript.EvalSha(ctx, p, keys, arg)
}

// sendOne sends one call: an FCALL, or an EVALSHA that go-redis turns into an
// EVAL on NOSCRIPT.
func sendOne(ctx context.Context, client goredis.UniversalClient, fn bool, keys []string, arg []byte) *goredis.Cmd {
	if fn {
		return client.FCall(ctx, fnName, keys, arg)
	}
	return batchScript.Run(ctx, client, keys, arg)
}

// scriptCall is a call of batch.lua on keys with arg, by itself; the call
// and its route are one allocation (every decision makes one).
func scriptCall(keys []string, arg []byte) *call {
	both := &struct {
		call
		scriptRoute
	}{call{keys: keys}, scriptRoute{keys: keys, arg: arg}}
	both.route = &both.scriptRoute
	return &both.call
}
