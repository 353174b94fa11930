package rlqs

import (
	"context"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/openrls/ratelimit/src/limiter"
)

// TestAReportBoundsItsWindowsNeed: on a window of a minute, a grant of 1
// token a second and capacity 2, first sent 10 s in (a reset), needs 7 in
// all; a report received after a mark (a round) and at least the
// delivery bound later, of 1 request, leaves it needing 1 + 2 (the
// tokens it may hold at the mark) + the 2 s of rate left after the mark.
// A report that may have been cut before every mark of the window, or
// received in another window, bounds nothing; a reset that may fall after
// the mark, and a capacity grown since, count.
func TestAReportBoundsItsWindowsNeed(t *testing.T) {
	const delivery = time.Second
	ws := time.Unix(1_700_000_040, 0) // a minute's start
	t1 := ws.Add(10 * time.Second)
	for _, tc := range []struct {
		name       string
		reportAt   time.Duration // after t1; negative: before the window
		growAt     time.Duration // after t1, a grant of capacity 4: 0 for none
		full, want uint64
	}{
		{"a report after the mark", 4500 * time.Millisecond, 0, 7, 1 + 2 + 2},
		{"a report that may have been cut before the window's first mark", 500 * time.Millisecond, 0, 7, 7},
		{"a report of the window before", -11 * time.Second, 0, 7, 7},
		// Grown at 3.2 s, as the report's cut may be: a reset after the mark,
		// at the new capacity, and the rate to 8.2 s: 1 + 4 + 4 + 5.
		{"a capacity grown after the mark", 4500 * time.Millisecond, 3200 * time.Millisecond, 4*2 + 8, 1 + 4 + 4 + 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLedger(time.Minute)
			send := func(at time.Time, c uint64) {
				l.advance(at)
				grows := l.grant(c, at, at.Add(5*time.Second))
				switch {
				case l.began.IsZero():
					l.reset(at, at)
				case grows:
					l.reset(at, at.Add(delivery))
				}
				l.raise(at, at.Add(5*time.Second), 1)
			}
			send(t1, 2)
			l.advance(t1.Add(3 * time.Second)) // a round's mark
			if tc.growAt > 0 {
				send(t1.Add(tc.growAt), 4)
			}
			at := t1.Add(tc.reportAt)
			l.noteReport(at, at.Add(-delivery), 1)
			w := l.window(t1)
			unlent := l.clone()
			unlent.lent = &lending{}
			if got := unlent.need(w); got != tc.full {
				t.Fatalf("without reports the window needs %d, want %d", got, tc.full)
			}
			if got := l.need(w); got != tc.want {
				t.Errorf("the window needs %d, want %d", got, tc.want)
			}
		})
	}
}

// TestReportsLendThroughTheService: an Envoy of 1 request a second on a
// limit of 300 a minute, reporting every 5 s as Envoy 1.40 does. After
// half a minute the store holds for the minute what the bucket's ledger
// says, less than what its grants could have admitted from the minute's
// start (each change of grant costs both rates until it hands over),
// and no less than what the Envoy reported. On a limit of 30 a second,
// whose windows end before a report's cut could follow a round, nothing
// is lent.
func TestReportsLendThroughTheService(t *testing.T) {
	for _, tc := range []struct {
		unit  string
		limit int
		lends bool
	}{
		{"minute", 300, true},
		{"second", 30, false},
	} {
		t.Run(tc.unit, func(t *testing.T) {
			now := time.Unix(1_700_000_040, 300_000_000) // 0.3 s into a minute
			mem := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
			s := New(Options{Store: mem, Configs: oneLimit(t, tc.unit, tc.limit), Clock: func() time.Time { return now }})
			s.o.Logger = quietLogger()
			st, err := s.open("")
			if err != nil {
				t.Fatal(err)
			}
			usage := func(n uint64) *rlqsv3.RateLimitQuotaUsageReports {
				return &rlqsv3.RateLimitQuotaUsageReports{Domain: "fleet", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
					BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"tenant": "a"}}, TimeElapsed: durationpb.New(5 * time.Second), NumRequestsAllowed: n}}}
			}
			fresh := s.report(st, usage(1))
			s.round(context.Background(), fresh)
			sendAll(s, st)
			b := fresh[0]
			reported := uint64(1)
			for i := 1; i <= 30; i++ {
				now = now.Add(time.Second)
				if i%5 == 0 {
					n := uint64(4 + i%10/5*2) // 4 and 6 in turn: the grant changes
					s.report(st, usage(n))
					reported += n
				}
				s.round(context.Background(), nil)
				sendAll(s, st)
			}
			m := b.members[0]
			w := m.l.window(now)
			got := m.l.wins.get(w).held
			if stored := held(t, mem, m, w); stored != got {
				t.Fatalf("the store holds %d for the window, the ledger %d", stored, got)
			}
			unlent := m.l.clone()
			unlent.lent = &lending{}
			full := unlent.need(w)
			switch {
			case tc.lends && got >= full:
				t.Errorf("the window holds %d, what its grants could admit from its start (%d): nothing was lent", got, full)
			case tc.lends && got < reported:
				t.Errorf("the window holds %d, less than the %d requests reported", got, reported)
			case !tc.lends && got != full:
				t.Errorf("the window holds %d, want %d: a window shorter than a report's reach lent", got, full)
			}
			t.Logf("held %d of the %d its grants could admit; %d reported", got, full, reported)
		})
	}
}
