package redis

import (
	"context"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// probeKey is the key the plain path's permission probe names; it leaves
// nothing there.
const probeKey = keyVersion + "{probe}"

// plainProbe says whether Redis lets this user run the plain path's
// commands, before any is sent for a decision: a MULTI the ACL refused
// would leave the INCRBYs after it to run on their own, and the function
// would then count those hits again. On a connection of its own, closed
// after (a transaction left open must not go back to the pool), it first
// sends PEXPIREAT of probeKey alone, which does nothing (the key does not
// exist), then a transaction of INCRBY of probeKey by 0, PEXPIREAT of it in
// the past and TIME: an ACL refuses a command as it is queued, which
// aborts the transaction. Whatever the ACL refuses, nothing is left: a
// refused PEXPIREAT stops the probe before anything is written, and once it
// is known to run, an INCRBY that runs (alone, if MULTI was refused) is
// followed by the PEXPIREAT that deletes what it made. It returns whether
// the plain path may serve, and whether that is known (false after an
// error that may pass: the network, a loading Redis).
func plainProbe(ctx context.Context, client goredis.UniversalClient) (ok, known bool) {
	var node *goredis.Client
	switch c := client.(type) {
	case *goredis.Client:
		node = c
	case *goredis.ClusterClient:
		n, err := c.MasterForKey(ctx, probeKey)
		if err != nil {
			return false, false
		}
		node = n
	default:
		return false, true // a client this store does not make: the function serves
	}
	// The node's own options, authentication of every kind included
	// (REDIS_AUTH_FILE's provider), with a pool of its own of one.
	o := *node.Options()
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns = 1, 0, 0, 0
	// A connection that lives for one probe needs no maintenance
	// notifications; the copied options' handlers would be registered a
	// second time, which go-redis logs as a failure on every probe.
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	probe := goredis.NewClient(&o)
	defer probe.Close()
	if err := probe.Do(ctx, "PEXPIREAT", probeKey, 1, "NX").Err(); err != nil {
		return false, plainRefused(err)
	}
	cmds, err := probe.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.Do(ctx, "INCRBY", probeKey, 0)
		p.Do(ctx, "PEXPIREAT", probeKey, 1, "NX")
		p.Do(ctx, "TIME")
		return nil
	})
	if plainRefused(err) {
		return false, true
	}
	for _, c := range cmds {
		if plainRefused(c.Err()) {
			return false, true
		}
	}
	return err == nil, err == nil
}

// probeEvery spaces permission probes that found nothing definite.
const probeEvery = time.Second
