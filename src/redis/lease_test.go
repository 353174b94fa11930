package redis

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/limiter/limitertest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

func leaseOptions() Options {
	return Options{LeaseInterval: 50 * time.Millisecond, LeaseIdle: time.Second}
}

// windowCount reads a window algorithm's current count from Redis: the
// second of the three doubles batch.lua stores.
func windowCount(t *testing.T, c goredis.UniversalClient, key string) uint64 {
	t.Helper()
	b, err := c.Get(context.Background(), keyVersion+key).Bytes()
	if err == goredis.Nil {
		return 0
	}
	if err != nil || len(b) != 24 {
		t.Fatalf("GET %s: %d bytes, %v", key, len(b), err)
	}
	return uint64(math.Float64frombits(binary.LittleEndian.Uint64(b[8:16])))
}

// TestLeaseMatchesMemoryStore runs one random schedule of hits, checks,
// refunds, shadow hits, all-or-nothing batches and dry runs on leased
// rules through one replica, against the embedded store: a single replica
// must decide exactly as without leases (a slice is budget only it can
// spend, and what it does not fit it asks Redis for), and on a fixed
// window answer the same remaining and times.
func TestLeaseMatchesMemoryStore(t *testing.T) {
	rules := []limiter.Rule{
		{Algorithm: limiter.FixedWindow, Limit: 40, Period: 10 * time.Second, Lease: "fw"},
		{Algorithm: limiter.SlidingWindow, Limit: 40, Period: 10 * time.Second, Lease: "sw"},
		{Algorithm: limiter.FixedWindow, Limit: 7, Period: time.Minute, Lease: "small"},
		{Algorithm: limiter.FixedWindow, Limit: 9, Period: time.Minute}, // not leased, in the same batches
	}
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { leaseDifferential(t, rules, seed) })
	}
}

func leaseDifferential(t *testing.T, rules []limiter.Rule, seed uint64) {
	srv := redistest.Start(t)
	// The schedule's clock moves 150 ms per batch on average: slices sized
	// for 2 s of it hold a few hits each.
	rs := newStore(t, single(t, srv), Options{LeaseInterval: 2 * time.Second, LeaseIdle: time.Hour})
	mem := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
	defer mem.Close()
	rng := rand.New(rand.NewPCG(7, 11+seed))
	now := limitertest.T0
	prefix := fmt.Sprintf("lease:%d:", time.Now().UnixNano())
	before := commandCalls(t, srv)["evalsha"]
	local := 0
	for step := range 2000 {
		now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
		n := 1 + rng.IntN(3)
		hits := make([]limiter.Hit, n)
		for i := range hits {
			ri := rng.IntN(len(rules))
			if rng.IntN(3) > 0 {
				ri = rng.IntN(2) // mostly the two busy keys
			}
			hits[i] = limiter.Hit{Key: fmt.Sprintf("%s{k%d}", prefix, ri), Rule: rules[ri],
				Cost: uint64(rng.IntN(4)), Refund: rng.IntN(6) == 0, Advisory: rng.IntN(8) == 0}
		}
		b := limiter.Batch{Now: now, Hits: hits, AllOrNothing: rng.IntN(3) == 0, DryRun: rng.IntN(10) == 0}
		want, err := mem.Apply(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		calls := commandCalls(t, srv)["evalsha"]
		got, err := rs.Apply(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		if commandCalls(t, srv)["evalsha"] == calls {
			local++
		}
		for i := range hits {
			if b.DryRun {
				// A dry run may see less than the embedded store where a
				// slice covers part of a hit that Redis then rejects (see
				// admit); checked below: never more.
				if got[i].Allowed && !want[i].Allowed {
					t.Fatalf("step %d: dry run allowed hit %d that the embedded store rejects: %+v vs %+v", step, i, got, want)
				}
				continue
			}
			same := got[i].Allowed == want[i].Allowed
			if hits[i].Rule.Algorithm == limiter.FixedWindow {
				same = got[i] == want[i]
			}
			if !same {
				t.Fatalf("step %d at T0+%v, hit %d of batch %+v:\nleased %+v\nmemory %+v", step, now.Sub(limitertest.T0), i, b, got, want)
			}
		}
	}
	if local < 250 {
		t.Errorf("only %d of 2000 batches were answered without Redis: the slices are not used", local)
	}
	t.Logf("%d of 2000 batches answered from slices; %d script calls; %+v", local, commandCalls(t, srv)["evalsha"]-before, rs.LeaseStats())
}
