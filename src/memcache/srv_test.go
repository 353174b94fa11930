package memcache

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/memcache/memcachedtest"
)

// fakeDNS answers SRV lookups from a table it can be told to change: DNS
// is not what is under test (the memcached servers are real).
type fakeDNS struct {
	mu      sync.Mutex
	records []*net.SRV
	err     error
	asked   []string
}

func (f *fakeDNS) lookup(_ context.Context, service, proto, name string) (string, []*net.SRV, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, service+"/"+proto+"/"+name)
	return "", f.records, f.err
}

func (f *fakeDNS) set(recs []*net.SRV, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.records, f.err = recs, err
}

func srvOf(t *testing.T, addr string) *net.SRV {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	return &net.SRV{Target: host, Port: uint16(p)}
}

func TestSRVServers(t *testing.T) {
	dns := &fakeDNS{records: []*net.SRV{{Target: "b.example.", Port: 11211}, {Target: "a.example.", Port: 11212}}}
	got, err := SRVServers(context.Background(), dns.lookup, "_memcache._tcp.cache.example")
	if err != nil || strings.Join(got, ",") != "a.example.:11212,b.example.:11211" {
		t.Errorf("SRVServers = %v, %v, want the targets sorted", got, err)
	}
	if dns.asked[0] != "memcache/tcp/cache.example" {
		t.Errorf("asked %v, want service memcache, proto tcp, name cache.example", dns.asked)
	}
	for _, bad := range []string{"cache.example", "_memcache.cache", ""} {
		if _, err := SRVServers(context.Background(), dns.lookup, bad); err == nil {
			t.Errorf("SRVServers(%q): no error", bad)
		}
	}
	dns.set(nil, nil)
	if _, err := SRVServers(context.Background(), dns.lookup, "_m._tcp.x"); err == nil {
		t.Error("no records: no error")
	}
}

// TestWatchSRV: a refresh moves the store to the servers the records name
// now; a failed lookup keeps the servers there are.
func TestWatchSRV(t *testing.T) {
	a, b := memcachedtest.Start(t), memcachedtest.Start(t)
	dns := &fakeDNS{records: []*net.SRV{srvOf(t, a.Addr)}}
	servers, err := SRVServers(context.Background(), dns.lookup, "_memcache._tcp.local")
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, Options{Servers: servers})
	failures := make(chan error, 100)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.WatchSRV(ctx, dns.lookup, "_memcache._tcp.local", 5*time.Millisecond, func(err error) { failures <- err })

	r := limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 1, Period: time.Hour, CountRejected: true}
	hit := func() bool {
		out, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: "srv", Rule: r, Cost: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		return out[0].Allowed
	}
	if !hit() || hit() {
		t.Fatal("on a: want the first hit allowed, the second not")
	}
	dns.set(nil, errors.New("SERVFAIL"))
	<-failures
	if hit() {
		t.Error("a failed lookup moved the store off a")
	}
	dns.set([]*net.SRV{srvOf(t, b.Addr)}, nil)
	deadline := time.Now().Add(time.Minute)
	for !hit() { // b has no count yet: the first hit there passes
		if time.Now().After(deadline) {
			t.Fatal("the store never moved to b")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
