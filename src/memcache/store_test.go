package memcache

import (
	"context"
	"fmt"
	"hash/crc32"
	"strings"
	"testing"
	"time"

	gomemcache "github.com/bradfitz/gomemcache/memcache"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/limiter/limitertest"
	"github.com/openrls/ratelimit/src/memcache/memcachedtest"
)

func newStore(t *testing.T, o Options) *Store {
	t.Helper()
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestConformanceSingle and TestConformanceThree run the store suite
// every store passes, on one memcached and on three.
func TestConformanceSingle(t *testing.T) {
	s := newStore(t, Options{Servers: []string{memcachedtest.Start(t).Addr}})
	limitertest.Run(t, func(*testing.T) limiter.Store { return s })
}

func TestConformanceThree(t *testing.T) {
	var addrs []string
	for range 3 {
		addrs = append(addrs, memcachedtest.Start(t).Addr)
	}
	s := newStore(t, Options{Servers: addrs, Prefix: "three:"})
	limitertest.Run(t, func(*testing.T) limiter.Store { return s })
}

// TestTwoReplicasExact: two stores (two replicas) on the same memcached,
// 200 concurrent calls on a limit of 40, for each algorithm and both
// counting rules: exactly 40 admitted.
func TestTwoReplicasExact(t *testing.T) {
	srv := memcachedtest.Start(t)
	replicas := []limiter.Store{newStore(t, Options{Servers: []string{srv.Addr}}), newStore(t, Options{Servers: []string{srv.Addr}})}
	rules := map[string]limiter.Rule{
		"fixed_window/count":     {Algorithm: limiter.FixedWindow, Limit: 40, Period: time.Hour, CountRejected: true},
		"fixed_window/drop":      {Algorithm: limiter.FixedWindow, Limit: 40, Period: time.Hour},
		"sliding_window":         {Algorithm: limiter.SlidingWindow, Limit: 40, Period: time.Hour},
		"token_bucket":           {Algorithm: limiter.TokenBucket, Limit: 40, Period: time.Hour},
		"sliding_log":            {Algorithm: limiter.SlidingLog, Limit: 40, Period: time.Hour},
		"concurrency":            {Algorithm: limiter.Concurrency, Limit: 40, Period: time.Hour},
		"fixed_window/overdraft": {Algorithm: limiter.FixedWindow, Limit: 40, Period: time.Hour, Overdraft: true},
	}
	for name, r := range rules {
		t.Run(name, func(t *testing.T) {
			key := fmt.Sprintf("exact:%s:%d", name, time.Now().UnixNano())
			if got := limitertest.Allowed(t, replicas, key, r, time.Time{}, 200, 1); got != 40 {
				t.Errorf("200 concurrent calls through two replicas on a limit of 40: %d admitted, want exactly 40", got)
			}
		})
	}
}

// TestKeyOnTheReferencesServer: with several servers, a key lives on the
// one envoyproxy/ratelimit's client picks: CRC-32 of the key, modulo the
// number of servers.
func TestKeyOnTheReferencesServer(t *testing.T) {
	var addrs []string
	var direct []*gomemcache.Client
	for range 3 {
		a := memcachedtest.Start(t).Addr
		addrs = append(addrs, a)
		direct = append(direct, gomemcache.New(a))
	}
	s := newStore(t, Options{Servers: addrs})
	r := limiter.Rule{Algorithm: limiter.TokenBucket, Limit: 5, Period: time.Minute}
	for i := range 30 {
		hit := limiter.Hit{Key: fmt.Sprintf("where:%d", i), Rule: r, Cost: 1}
		if _, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{hit}}); err != nil {
			t.Fatal(err)
		}
		key := s.key(hit.Key, "")
		want := crc32.ChecksumIEEE([]byte(key)) % 3
		for j, c := range direct {
			_, err := c.Get(key)
			if found := err == nil; found != (uint32(j) == want) {
				t.Errorf("key %q on server %d: %v, want it on server %d alone", key, j, found, want)
			}
		}
	}
}

// TestHostileKeys: keys past memcached's 250 bytes, or with spaces and
// control bytes its protocol cannot carry, are stored under their hash,
// apart from each other and exactly counted.
func TestHostileKeys(t *testing.T) {
	s := newStore(t, Options{Servers: []string{memcachedtest.Start(t).Addr}, Prefix: "hostile:"})
	r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 2, Period: time.Hour, CountRejected: true}
	keys := []string{strings.Repeat("k", 1000), strings.Repeat("k", 999) + "j", "a b", "a\r\nset x 0 0 1\r\n", "tab\there", "del\x7f"}
	for _, k := range keys {
		for i, want := range []bool{true, true, false} {
			out, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: k, Rule: r, Cost: 1}}})
			if err != nil {
				t.Fatalf("key %q: %v", k, err)
			}
			if out[0].Allowed != want {
				t.Errorf("key %q, call %d: allowed %v, want %v", k, i+1, out[0].Allowed, want)
			}
		}
		if mk := s.key(k, ""); len(mk) > maxKeyBytes || !legal(mk) {
			t.Errorf("key %q is stored as %q", k, mk)
		}
	}
}

// TestServerDown: a memcached that does not answer is an error (the
// failure policy's to answer), within the timeout.
func TestServerDown(t *testing.T) {
	srv := memcachedtest.Start(t)
	s := newStore(t, Options{Servers: []string{srv.Addr}, Timeout: 200 * time.Millisecond})
	srv.Stop()
	r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 2, Period: time.Hour}
	if _, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: "down", Rule: r, Cost: 1}}}); err == nil {
		t.Error("Apply on a stopped memcached: no error")
	}
	if err := s.Ping(context.Background()); err == nil {
		t.Error("Ping on a stopped memcached: no error")
	}
}

func TestSetServersRefusesBadAddresses(t *testing.T) {
	for _, a := range []string{"localhost", "a:b:c", ""} {
		if _, err := New(Options{Servers: []string{a}}); err == nil {
			t.Errorf("New with server %q: no error", a)
		}
	}
}
