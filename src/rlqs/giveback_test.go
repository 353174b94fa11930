package rlqs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
)

// cfgHolder serves one config, as the service's reloader does.
type cfgHolder struct{ cfg *config.Config }

func (h cfgHolder) Load() *config.Config { return h.cfg }

// rivalStore is a real store beside which another replica counts: armed,
// the first batch that counts more than rivalLeaves tokens for a window
// finds that window filled by the rival up to rivalLeaves, counted just
// before it.
type rivalStore struct {
	limiter.Store
	armed atomic.Bool
	key   string // the window the rival filled
	rival uint64 // and by how much
	// failRefunds makes every call that gives back fail, as a store that
	// goes away between the count and the give-back: before applying it,
	// or, with appliedAnyway, after (the answer lost).
	failRefunds, appliedAnyway bool
}

const rivalLeaves = 8

var errAway = errors.New("rivalStore: away")

func (r *rivalStore) Apply(ctx context.Context, b limiter.Batch) ([]limiter.Outcome, error) {
	if r.failRefunds && len(b.Hits) > 0 && b.Hits[0].Refund {
		if r.appliedAnyway {
			_, _ = r.Store.Apply(ctx, b)
		}
		return nil, errAway
	}
	if len(b.Hits) > 0 && !b.Hits[0].Refund && b.Hits[0].Cost > rivalLeaves && r.armed.CompareAndSwap(true, false) {
		h := b.Hits[0]
		r.key, r.rival = h.Key, h.Rule.Limit-rivalLeaves
		fill := limiter.Hit{Key: h.Key, Rule: h.Rule, Cost: r.rival}
		if _, err := r.Store.Apply(ctx, limiter.Batch{Now: b.Now, Hits: []limiter.Hit{fill}}); err != nil {
			return nil, err
		}
	}
	return r.Store.Apply(ctx, b)
}

// TestAShortGrantHoldsOnlyWhatItSends: a round counts its grants at once,
// without checking first. When another replica took a window's room just
// before, the grant falls short there: what was counted for it in its
// other windows is given back, and it is cut to what fits. After the
// round the store holds, in every window, what the bucket's ledger says it
// holds (plus the rival's count), not the uncut grant beside the cut one.
func TestAShortGrantHoldsOnlyWhatItSends(t *testing.T) {
	s, store, b := shortGrant(t, false, false)
	var short dto.Metric
	if err := s.stats.shortfalls.Write(&short); err != nil || short.GetCounter().GetValue() == 0 {
		t.Fatal("the grant did not fall short: the rival's count did not bite")
	}
	m := b.members[0]
	windows := 0
	for _, w := range m.l.wins {
		key := limiter.WindowKey(m.p.key, w.w)
		stored := held(t, store.Store, m, w.w)
		want := w.held
		if key == store.key {
			want += store.rival
		}
		if stored != want {
			t.Errorf("window %d: the store holds %d, want %d (the ledger's %d, the rival's in %s)", w.w, stored, want, w.held, store.key)
		}
		windows++
	}
	if windows < 2 {
		t.Errorf("the grant held %d windows, want at least 2 (the one the rival filled and others)", windows)
	}
	if b.sentKind != kindLimited {
		t.Errorf("the bucket was sent %v, want its cut token bucket", b.sentKind)
	}
}

// TestAFailedGiveBackSendsNothing: when the store fails the call that
// gives a short grant back and counts its cut, whether it applied either
// is unknown. The bucket is sent nothing, and in no window does its
// ledger claim more than the store holds for it: a ledger that counted
// tokens the store gave back, or never counted, could grant past the
// limit later; tokens the store holds beyond the ledger are only idle
// until their window ends.
func TestAFailedGiveBackSendsNothing(t *testing.T) {
	for _, applied := range []bool{false, true} {
		t.Run(map[bool]string{false: "not applied", true: "applied, answer lost"}[applied], func(t *testing.T) {
			s, store, b := shortGrant(t, true, applied)
			if b.sentKind != kindNone {
				t.Errorf("the bucket was sent %v, want nothing", b.sentKind)
			}
			m := b.members[0]
			for _, w := range m.l.wins {
				stored := held(t, store.Store, m, w.w)
				if limiter.WindowKey(m.p.key, w.w) == store.key {
					stored -= store.rival
				}
				if w.held > stored {
					t.Errorf("window %d: the ledger holds %d, the store %d for it", w.w, w.held, stored)
				}
			}
			var errs dto.Metric
			if err := s.stats.storeErrors.Write(&errs); err != nil || errs.GetCounter().GetValue() == 0 {
				t.Errorf("the failed give-back was not counted as a store error")
			}
		})
	}
}

// shortGrant runs a new bucket's first round (20/s on a limit of 30/s)
// beside a rival that fills one of its windows first.
func shortGrant(t *testing.T, failRefunds, appliedAnyway bool) (*Service, *rivalStore, *bucket) {
	t.Helper()
	now := time.Unix(1_700_000_000, 300_000_000)
	store := &rivalStore{Store: limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1}), failRefunds: failRefunds, appliedAnyway: appliedAnyway}
	s := New(Options{Store: store, Configs: fleet(t), Clock: func() time.Time { return now }})
	s.o.Logger = quietLogger()
	st, err := s.open("")
	if err != nil {
		t.Fatal(err)
	}
	fresh := s.report(st, &rlqsv3.RateLimitQuotaUsageReports{Domain: "fleet", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "a"}}, TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 20}}})
	if len(fresh) != 1 {
		t.Fatalf("%d buckets made, want 1", len(fresh))
	}
	store.armed.Store(true)
	s.round(context.Background(), fresh)
	if store.key == "" {
		t.Fatal("the round counted nothing")
	}
	return s, store, fresh[0]
}

// quietLogger drops the service's log: the store errors here are the
// test's doing.
func quietLogger() logrus.FieldLogger {
	log := logrus.New()
	log.SetOutput(io.Discard)
	return log
}

// held is what the store holds in window w of m's pool.
func held(t *testing.T, store limiter.Store, m *member, w int64) uint64 {
	t.Helper()
	outs, err := store.Apply(context.Background(), limiter.Batch{Now: m.l.start(w), DryRun: true,
		Hits: []limiter.Hit{{Key: limiter.WindowKey(m.p.key, w), Rule: m.p.rule}}})
	if err != nil {
		t.Fatal(err)
	}
	return m.p.rule.Limit - outs[0].Remaining
}

// TestALoweredGrantGivesBackItsExcess: once a lower grant's message (or a
// DENY_ALL's) is on its way, the higher one ends when it arrives (the
// delivery bound), and the store holds past that only what the lower one
// needs (DENY_ALL: nothing); the windows before stay held for the higher
// one. When the message is dropped (the
// Envoy reads too slowly), or still waits to be sent, the higher grant
// stays in force, and held, to its own horizon or until it leaves.
func TestALoweredGrantGivesBackItsExcess(t *testing.T) {
	const (
		left    = iota // the message leaves
		dropped        // the stream's queue is full: it is dropped
		waiting        // it waits in the queue, not yet sent
	)
	for _, tc := range []struct {
		name            string
		fate            int
		reported, wants uint64 // the bucket's last report, and what the other wants
	}{
		{"lowered", left, 4, 80},
		{"lowered, message dropped", dropped, 4, 80},
		{"lowered, message not yet sent", waiting, 4, 80},
		{"denied", left, 0, 80},
		{"denied, message dropped", dropped, 0, 80},
		{"denied, message not yet sent", waiting, 0, 80},
	} {
		kept := tc.fate != left // the higher grant stays in force
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1_700_000_000, 300_000_000)
			mem := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
			s := New(Options{Store: mem, Configs: fleet(t), Clock: func() time.Time { return now }})
			s.o.Logger = quietLogger()
			st, err := s.open("")
			if err != nil {
				t.Fatal(err)
			}
			other, err := s.open("") // another Envoy, wanting 40 a second throughout
			if err != nil {
				t.Fatal(err)
			}
			usage := func(n uint64) *rlqsv3.RateLimitQuotaUsageReports {
				return &rlqsv3.RateLimitQuotaUsageReports{Domain: "fleet", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
					BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "a"}}, TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: n}}}
			}
			fresh := s.report(st, usage(25))
			s.round(context.Background(), append(fresh, s.report(other, usage(25))...))
			now = now.Add(2 * time.Second)
			s.report(st, usage(55)) // 40 a second measured
			s.report(other, usage(55))
			s.round(context.Background(), nil)
			sendAll(s, st, other)
			s.round(context.Background(), nil) // hands the 40 a second over
			sendAll(s, st, other)
			b := fresh[0]
			m := b.members[0]
			high := b.sentQ
			before := map[int64]uint64{}
			for _, w := range m.l.wins {
				before[w.w] = w.held
			}
			now = now.Add(2 * time.Second)
			s.report(st, usage(tc.reported))
			s.report(other, usage(tc.wants))
			if tc.fate == dropped {
				for len(st.out) < cap(st.out) {
					st.out <- &outgoing{msg: &rlqsv3.RateLimitQuotaResponse{}, at: now}
				}
			}
			s.round(context.Background(), nil)
			// The lowered grant's message leaves (or, dropped, never
			// does, or waits), and the next round hands it over.
			if tc.fate == left {
				sendAll(s, st)
			}
			sendAll(s, other)
			s.round(context.Background(), nil)
			switch {
			case tc.reported == 0 && b.sentKind != kindDeny:
				t.Fatalf("the bucket was sent %v, want DENY_ALL", b.sentKind)
			case tc.reported > 0 && b.sentQ >= high:
				t.Fatalf("the grant went from %d to %d a second, want lower", high, b.sentQ)
			}
			cur, cut := m.l.window(now), m.l.window(now.Add(s.o.Delivery))
			lowered := 0
			for w, was := range before {
				if w < cur {
					continue
				}
				got := m.l.wins.get(w).held
				switch {
				case kept && got < was:
					t.Errorf("window %d: the bucket holds %d, held %d: given back for a grant not sent", w, got, was)
				case !kept && w < cut && got < was:
					t.Errorf("window %d, before the new grant arrives: the bucket holds %d, held %d", w, got, was)
				case got < was:
					lowered++
				}
				var ledgers uint64
				for mm := range m.p.members {
					ledgers += mm.l.wins.get(w).held
				}
				if stored := held(t, mem, m, w); stored != ledgers {
					t.Errorf("window %d: the store holds %d, the buckets' ledgers %d", w, stored, ledgers)
				}
			}
			if !kept && lowered == 0 {
				t.Errorf("no window after the hand-over was given back anything: %v", before)
			}
		})
	}
}

// fleetStream is a Service on the embedded store with fleet's config and
// clock's time, its log dropped, and a stream opened on it.
func fleetStream(t *testing.T, clock func() time.Time) (*Service, *stream) {
	t.Helper()
	s := New(Options{Store: limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1}), Configs: fleet(t), Clock: clock})
	s.o.Logger = quietLogger()
	st, err := s.open("")
	if err != nil {
		t.Fatal(err)
	}
	return s, st
}

// fleet is a config of one limit, 30 a second for tenant a.
func fleet(t *testing.T) cfgHolder {
	t.Helper()
	return oneLimit(t, "second", 30)
}

// oneLimit is a config of one limit for tenant a, of limit per unit.
func oneLimit(t *testing.T, unit string, limit int) cfgHolder {
	t.Helper()
	yaml := fmt.Sprintf("domain: fleet\ndescriptors:\n  - key: tenant\n    value: a\n    rate_limit: {unit: %s, requests_per_unit: %d}\n", unit, limit)
	f, err := config.Parse("rlqs.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Build([]*config.File{f}, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return cfgHolder{cfg}
}

// TestHandOverLowersTheCapacityInForce: a window that starts after a
// hand-over to a capacity of 1 needs 1 token kept from the window before,
// not the 2 a larger capacity sent earlier could carry in; a window that
// starts before it still needs 2, and a grant sent after the hand-over
// counts again.
func TestHandOverLowersTheCapacityInForce(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	send := func(l *ledger, c uint64, at time.Time, rate float64) uint64 {
		until := at.Add(5 * time.Second)
		l.grant(c, at, until)
		l.raise(at, until, rate)
		return l.note(seg{at, until, rate}, c)
	}
	l := newLedger(time.Second)
	send(l, 2, t0, 10)
	w := l.window(t0)
	if got := l.need(w + 3); got != 2+10 {
		t.Fatalf("before any hand-over, window 3 needs %d, want 12", got)
	}
	t1 := t0.Add(1500 * time.Millisecond)
	id := send(l, 1, t1, 10)
	l.handOver(t1, t1.Add(time.Second), id, func(int64, uint64) {})
	for _, tc := range []struct {
		w    int64
		want uint64
	}{
		{w + 2, 2 + 10}, // starts at 2 s, before the hand-over at 2.5 s
		{w + 3, 1 + 10},
		{w + 6, 1 + 5}, // the last grant ends at 6.5 s
	} {
		if got := l.need(tc.w); got != tc.want {
			t.Errorf("window %d: needs %d, want %d", tc.w-w, got, tc.want)
		}
	}
	send(l, 2, t1.Add(time.Second), 10)
	if got := l.need(w + 4); got != 2+10 {
		t.Errorf("after a grant of capacity 2 sent since, window 4 needs %d, want 12", got)
	}
}

// sendAll does what the streams' senders do with the messages the rounds
// queued: each leaves at once, within the delivery bound.
func sendAll(s *Service, streams ...*stream) {
	for _, st := range streams {
		for len(st.out) > 0 {
			s.delivered(<-st.out)
		}
	}
}
