package rlqs

import (
	"context"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/openrls/ratelimit/src/limiter"
)

// report is the owner's report of msg on st, as take runs it, but
// returning the buckets due a round at once rather than queueing them for
// Run: these tests run their rounds themselves.
func (s *Service) report(st *stream, msg *rlqsv3.RateLimitQuotaUsageReports) (due []*bucket) {
	if err := s.do("a test's report", func(g *state) { due = g.report(st, msg) }); err != nil {
		panic(err)
	}
	return due
}

// owned runs f on s's owner, as the service's own work runs.
func owned(t testing.TB, s *Service, f func(*state)) {
	t.Helper()
	if err := s.do("a test", f); err != nil {
		t.Fatal(err)
	}
}

// bare is a state of o with no owner: for tests of what one bucket or
// pool is planned, run on the test's goroutine alone.
func bare(o Options) *state {
	o = o.withDefaults()
	return newState(&o, newStats(), make(chan struct{}, 1))
}

// interleaver is a real store that runs during, at every call, before the
// call: the other paths' messages to the owner, arriving while a round is
// at the store.
type interleaver struct {
	limiter.Store
	during func()
}

func (i *interleaver) Apply(ctx context.Context, b limiter.Batch) ([]limiter.Outcome, error) {
	if i.during != nil {
		i.during()
	}
	return i.Store.Apply(ctx, b)
}

// TestReportsAndClosesInterleaveWithARound: while a round is at the store,
// one stream reports again and another closes, each a message to the
// owner. Were the store called on the owner, those messages would wait for
// good; called off it, they are taken between the round's phases: the
// closed stream's bucket is dropped and sent nothing, the others are sent
// their grants, the service's count of buckets is its streams', and the
// store holds at least what the live ledgers say it holds, within the
// limit.
func TestReportsAndClosesInterleaveWithARound(t *testing.T) {
	now := time.Unix(1_700_000_000, 300_000_000)
	store := &interleaver{Store: limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})}
	s := New(Options{Store: store, Configs: fleet(t), Clock: func() time.Time { return now }})
	s.o.Logger = quietLogger()
	var streams [3]*stream
	var fresh []*bucket
	for i := range streams {
		st, err := s.open("")
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = st
		fresh = append(fresh, s.report(st, usageOf("a", 20))...)
	}
	reporting, closing := streams[0], streams[1]
	var interleaved int
	store.during = func() {
		took := make(chan struct{})
		go func() {
			s.report(reporting, usageOf("a", 25))
			s.close(closing)
			close(took)
		}()
		select {
		case <-took:
			interleaved++
		case <-time.After(time.Minute):
			t.Error("a report and a close waited a minute for the owner while the round was at the store")
		}
	}
	if err := s.round(context.Background(), fresh); err != nil {
		t.Fatal(err)
	}
	store.during = nil
	if interleaved == 0 {
		t.Fatal("the round made no store call to interleave with")
	}
	for i, st := range streams {
		if sent, want := len(st.out), map[bool]int{true: 0, false: 1}[st == closing]; sent != want {
			t.Errorf("stream %d: %d messages sent, want %d", i, sent, want)
		}
	}
	var counted, tracked int
	var live []*member
	owned(t, s, func(g *state) {
		counted = g.buckets
		for st := range g.streams {
			tracked += len(st.buckets)
			for _, b := range st.buckets {
				live = append(live, b.members...)
			}
		}
	})
	if counted != tracked || tracked != 2 {
		t.Errorf("the service counts %d buckets, its streams hold %d, want 2", counted, tracked)
	}
	w := live[0].l.window(now)
	var ledgers uint64
	for _, m := range live {
		ledgers += m.l.wins.get(w).held
	}
	if inStore := held(t, store.Store, live[0], w); inStore < ledgers || inStore > live[0].p.rule.Limit {
		t.Errorf("the store holds %d in the present window, the live ledgers %d, the limit %d", inStore, ledgers, live[0].p.rule.Limit)
	}
}

// usageOf is one report of tenant's bucket, n requests allowed in a second.
func usageOf(tenant string, n uint64) *rlqsv3.RateLimitQuotaUsageReports {
	return &rlqsv3.RateLimitQuotaUsageReports{Domain: "fleet", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": tenant}}, TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: n}}}
}

// TestAServiceStoppedServesNothing: once Run has returned, the owner has
// stopped, and whatever asks it (a stream opening here; a report, in a
// stream) is answered Unavailable rather than left waiting.
func TestAServiceStoppedServesNothing(t *testing.T) {
	s := New(Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1}), Configs: fleet(t)})
	if _, err := s.open(""); err != nil {
		t.Fatalf("a stream of a running service: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { s.Run(ctx); close(ran) }()
	cancel()
	<-ran
	if _, err := s.open(""); status.Code(err) != codes.Unavailable {
		t.Errorf("a stream of a stopped service: %v, want Unavailable", err)
	}
}

// TestABucketIsQueuedForARoundOnce: a bucket reported due a round at once
// again before Run took it (a new bucket whose demand then fell, while a
// long round ran) is in the next round once: twice, it would be granted
// twice in one message, each grant reserved from the same ledger.
func TestABucketIsQueuedForARoundOnce(t *testing.T) {
	s := New(Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1}), Configs: fleet(t)})
	st, err := s.open("")
	if err != nil {
		t.Fatal(err)
	}
	fresh := s.report(st, usageOf("a", 20))
	var due []*bucket
	owned(t, s, func(g *state) {
		g.dueAtOnce(fresh)
		g.dueAtOnce(append(fresh, fresh...))
		due = g.takeAtOnce()
		g.dueAtOnce(fresh) // taken: it may be queued again
		due = append(due, g.takeAtOnce()...)
	})
	if len(fresh) != 1 || len(due) != 2 || due[0] != fresh[0] || due[1] != fresh[0] {
		t.Errorf("queued %d times for the first round and the next, want once each", len(due))
	}
}
