package redis

import (
	"context"
	"hash/maphash"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/openrls/ratelimit/src/limiter"
)

// knownWindows remembers window keys (KEY|w) this process has seen exist,
// so that a plain hit on one sends its INCRBY alone, without the PEXPIREAT
// that only a new key needs: a window key that exists has its TTL, since it
// is only ever created with it, in one transaction (plain.go) or one
// function call (batch.lua). It is a direct-mapped table of 64-bit hashes
// of the keys: a slot holds the last key that landed in it, so memory is
// fixed (512 KiB) and a lookup takes no lock.
//
// A key it wrongly believes exists (Redis lost it: a flush, a failover to a
// replica without it, eviction; or a late hit whose window had expired)
// is created by the INCRBY alone, without a TTL. The reply says so (the
// count is the hit's cost: the key was new), and the store then sets the
// TTL right after (sendRepairs), in the background: so only a process that
// dies in that moment, after Redis lost the key, leaves one key without a
// TTL.
type knownWindows struct {
	seed  maphash.Seed
	slots [1 << 16]atomic.Uint64
}

func newKnownWindows() *knownWindows { return &knownWindows{seed: maphash.MakeSeed()} }

// tag is wkey's hash, never 0 (an empty slot).
func (k *knownWindows) tag(wkey string) uint64 {
	return maphash.String(k.seed, wkey) | 1
}

func (k *knownWindows) has(tag uint64) bool {
	return k.slots[tag&uint64(len(k.slots)-1)].Load() == tag
}

func (k *knownWindows) add(tag uint64) {
	k.slots[tag&uint64(len(k.slots)-1)].Store(tag)
}

// repair is what a plain call's counts left to mend, in the background
// after the answer: a window key it created without its TTL (an orphan,
// see above), or a count it took past limiter.MaxCount.
type repair struct {
	key      string
	expireAt int64 // ms since the Unix epoch; 0: a count to set back, not an orphan
}

// repairTimeout bounds the background call that mends them.
const repairTimeout = 5 * time.Second

// sendRepairs mends them in one pipeline, in the background: an orphan
// gets its TTL (PEXPIREAT ... NX: a key that got one meanwhile keeps it),
// and a count past limiter.MaxCount is set back to it, as batch.lua's
// fixed_count does (SET ... XX KEEPTTL: a key that expired meanwhile is
// not made again). Without that, hits of the largest cost would take a
// shared key to INCRBY's overflow, and every decision on it would fail
// until its window ended.
func sendRepairs(client goredis.UniversalClient, repairs []repair) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), repairTimeout)
		defer cancel()
		_, _ = client.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for _, r := range repairs {
				if r.expireAt != 0 {
					p.Do(ctx, "PEXPIREAT", r.key, r.expireAt, "NX")
				} else {
					p.Do(ctx, "SET", r.key, limiter.MaxCount, "XX", "KEEPTTL")
				}
			}
			return nil
		})
	}()
}

// probeKey is the key the plain path's permission probe names; nothing is
// ever written to it.
const probeKey = keyVersion + "{probe}"

// plainProbe says whether Redis lets this user run the plain path's
// commands, before any is sent for a decision: a MULTI the ACL refused
// would leave the INCRBYs after it to run on their own, and the function
// would then count those hits again. On a connection of its own, closed
// after (a transaction left open must not go back to the pool), it runs a
// transaction of INCRBY of probeKey by 0, PEXPIREAT of it in the past and
// TIME: an ACL refuses a command as it is queued, which aborts the
// transaction, and one that runs leaves nothing (the key it makes, it
// deletes). It returns whether the plain path may serve, and
// whether that is known (false after an error that may pass: the
// network, a loading Redis).
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
	probe := goredis.NewClient(&o)
	defer probe.Close()
	// One write: if the ACL refused MULTI, the INCRBY by 0 runs alone and
	// the PEXPIREAT deletes what it made.
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
