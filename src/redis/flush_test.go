package redis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/limiter/limitertest"
	"github.com/openrls/ratelimit/src/redis/redistest"
)

// TestFunctionFlushMidLoadSingle: the function library flushed from a
// single node while batched decisions are in flight (merged into one call
// each) costs no error: the calls that found it missing run again as the
// script, their callers get those answers, and each hit counts once.
func TestFunctionFlushMidLoadSingle(t *testing.T) {
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
			srv := redistest.Start(t)
			s := newStore(t, single(t, srv), Options{Batch: batched})
			flushMidLoad(t, s, []*redistest.Server{srv}, fmt.Sprintf("single%v", batched))
		})
	}
}

// flushMidLoad runs 8 workers of 150 decisions each on keys of their own,
// flushes the function library from every node a third of the way, and
// checks that no decision failed and every hit counted once.
func flushMidLoad(t *testing.T, s *Store, nodes []*redistest.Server, tag string) {
	t.Helper()
	r := limiter.Rule{Limit: 1_000_000, Period: time.Hour, CountRejected: true}
	key := func(g int) string { return fmt.Sprintf("{flush-%s-%d}:fw", tag, g) }
	const workers, per = 8, 150
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	flushed := make(chan struct{})
	var once sync.Once
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				if g == 0 && i == per/3 {
					once.Do(func() {
						for _, n := range nodes {
							if _, err := n.Do("FUNCTION", "FLUSH"); err != nil {
								t.Error(err)
							}
						}
						close(flushed)
					})
				}
				if _, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: key(g), Rule: r, Cost: 1}}}); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	<-flushed
	if len(errs) > 0 {
		t.Errorf("%d of %d decisions failed after FUNCTION FLUSH, first: %v", len(errs), workers*per, errs[0])
	}
	for g := range workers {
		out, err := s.Apply(context.Background(), limiter.Batch{Hits: []limiter.Hit{{Key: key(g), Rule: r}}})
		if err != nil {
			t.Fatal(err)
		}
		if used := r.Limit - out[0].Remaining; used != per {
			t.Errorf("worker %d counted %d hits, want %d (each once)", g, used, per)
		}
	}
}

// TestFunctionCallRefusedByACL: a user that may load functions but not
// call them (FUNCTION LOAD allowed, FCALL denied) gets every decision,
// from the script, batched or not; the refusal is reported, and FCALL is
// not tried again call after call.
func TestFunctionCallRefusedByACL(t *testing.T) {
	srv := redistest.Start(t)
	if _, err := srv.Do("ACL", "SETUSER", "halfway", "on", ">secret", "~*", "+@all", "-fcall", "-fcall_ro"); err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ClientOptions{URL: srv.Addr, Type: "single", PoolSize: 4, Timeout: testTimeout, Auth: "halfway:secret"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
			s := newStore(t, c, Options{Batch: batched})
			r := limiter.Rule{Limit: 2, Period: time.Hour}
			h := []limiter.Hit{{Key: fmt.Sprintf("{acl-fcall-%v}:fw", batched), Rule: r, Cost: 1}}
			for i, want := range []bool{true, true, false} {
				out, err := s.Apply(context.Background(), limiter.Batch{Now: limitertest.T0, Hits: h})
				if err != nil || out[0].Allowed != want {
					t.Fatalf("call %d: %+v, %v; want allowed = %v", i, out, err, want)
				}
			}
			if err := s.FunctionsRefused(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
				t.Errorf("FunctionsRefused() = %v, want the NOPERM answer to FCALL", err)
			}
		})
	}
	if st := commandCalls(t, srv); st["fcall"] > 1 {
		t.Errorf("FCALL tried %d times: want it given up after the first refusal", st["fcall"])
	}
}
