package limiter_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/limiter/limitertest"
)

// recordingStore remembers the keys it was asked about.
type recordingStore struct {
	limiter.Store
	keys []string
}

func (r *recordingStore) Apply(ctx context.Context, b limiter.Batch) ([]limiter.Outcome, error) {
	for _, h := range b.Hits {
		r.keys = append(r.keys, h.Key)
	}
	return r.Store.Apply(ctx, b)
}

func TestSplitRoutesPerSecondRules(t *testing.T) {
	fast := &recordingStore{Store: newMemory(t, limiter.MemoryOptions{})}
	slow := &recordingStore{Store: newMemory(t, limiter.MemoryOptions{})}
	s := limiter.Split{PerSecond: fast, Other: slow}
	sec := limiter.Rule{Limit: 1, Period: time.Second}
	min := limiter.Rule{Limit: 5, Period: time.Minute}
	thirty := limiter.Rule{Limit: 5, Period: 30 * time.Second}
	hits := []limiter.Hit{{Key: "a", Rule: min, Cost: 1}, {Key: "b", Rule: sec, Cost: 1}, {Key: "c", Rule: thirty, Cost: 1}, {Key: "d", Rule: sec, Cost: 2}}
	outs, err := s.Apply(context.Background(), limiter.Batch{Now: limitertest.T0, Hits: hits})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmtKeys(fast.keys); got != "b d" {
		t.Errorf("per-second store got %q, want b d", got)
	}
	if got := fmtKeys(slow.keys); got != "a c" {
		t.Errorf("other store got %q, want a c", got)
	}
	// Outcomes come back in request order: a 4 left, b 0 left, c 4 left, d rejected.
	want := []struct {
		allowed bool
		rem     uint64
	}{{true, 4}, {true, 0}, {true, 4}, {false, 1}}
	for i, w := range want {
		if outs[i].Allowed != w.allowed || outs[i].Remaining != w.rem {
			t.Errorf("outcome %d = %+v, want allowed %v remaining %d", i, outs[i], w.allowed, w.rem)
		}
	}
}

func fmtKeys(keys []string) string { return strings.Join(keys, " ") }

// Under AllOrNothing a rejection on one side counts nothing on the other:
// the per-minute limit is not consumed by requests the per-second limit
// rejects.
func TestSplitAllOrNothingAcrossStores(t *testing.T) {
	apply := splitApplier(t)
	sec := limiter.Rule{Limit: 1, Period: time.Second}
	min := limiter.Rule{Limit: 5, Period: time.Minute}
	both := []limiter.Hit{{Key: "m", Rule: min, Cost: 1}, {Key: "s", Rule: sec, Cost: 1}}
	if outs := apply(true, both...); !outs[0].Allowed || !outs[1].Allowed || outs[0].Remaining != 4 {
		t.Fatalf("first request = %+v, want both allowed, 4 left a minute", outs)
	}
	for i := range 3 { // the second is over: nothing may be counted
		if outs := apply(true, both...); !outs[0].Allowed || outs[1].Allowed || outs[0].Remaining != 4 {
			t.Errorf("request %d = %+v, want the minute allowed with 4 left (not consumed) and the second rejected", i+2, outs)
		}
	}
	if outs := apply(false, limiter.Hit{Key: "m", Rule: min}); outs[0].Remaining != 4 {
		t.Errorf("minute counter after the rejected requests: %d left, want 4", outs[0].Remaining)
	}
	// An advisory rejection does not stop the count.
	advisory := []limiter.Hit{{Key: "m", Rule: min, Cost: 1}, {Key: "s", Rule: sec, Cost: 1, Advisory: true}}
	if outs := apply(true, advisory...); outs[0].Remaining != 3 {
		t.Errorf("with the second's rejection advisory = %+v, want the minute counted (3 left)", outs)
	}
}

// Under AllOrNothing, an overdraft rejection on one side counts the
// overdraft hit and nothing on the other side (limiter.Decide).
func TestSplitAllOrNothingWithOverdraft(t *testing.T) {
	apply := splitApplier(t)
	sec := limiter.Rule{Limit: 2, Period: time.Second, Overdraft: true}
	min := limiter.Rule{Limit: 5, Period: time.Minute}
	outs := apply(true, limiter.Hit{Key: "m", Rule: min, Cost: 1}, limiter.Hit{Key: "s", Rule: sec, Cost: 3})
	if !outs[0].Allowed || outs[0].Remaining != 5 || outs[1].Allowed {
		t.Errorf("overdraft over on one side = %+v, want the minute allowed but not counted (5 left), the second rejected", outs)
	}
	// The 3 were counted: after a refund of 2, 1 is used and 1 is left.
	if outs := apply(false, limiter.Hit{Key: "s", Rule: sec, Cost: 2, Refund: true}); outs[0].Remaining != 1 {
		t.Errorf("after a refund of 2: %+v, want 1 left (the overdraft hit was counted)", outs)
	}
	if outs := apply(false, limiter.Hit{Key: "m", Rule: min}); outs[0].Remaining != 5 {
		t.Errorf("minute counter: %d left, want 5", outs[0].Remaining)
	}
}

// splitApplier returns a function applying hits at T0 to a fresh Split of
// two memory stores.
func splitApplier(t *testing.T) func(allOrNothing bool, hits ...limiter.Hit) []limiter.Outcome {
	s := limiter.Split{PerSecond: newMemory(t, limiter.MemoryOptions{}), Other: newMemory(t, limiter.MemoryOptions{})}
	return func(allOrNothing bool, hits ...limiter.Hit) []limiter.Outcome {
		t.Helper()
		outs, err := s.Apply(context.Background(), limiter.Batch{Now: limitertest.T0, Hits: hits, AllOrNothing: allOrNothing})
		if err != nil {
			t.Fatal(err)
		}
		return outs
	}
}

// TestCheckThenCount: the steps taken follow Decide on the checked
// outcomes: a blocking rejection counts nothing, an overdraft rejection
// only the reports, none everything.
func TestCheckThenCount(t *testing.T) {
	plain := limiter.Hit{Key: "a", Rule: limiter.Rule{Limit: 1, Period: time.Minute}, Cost: 1}
	over := limiter.Hit{Key: "b", Rule: limiter.Rule{Limit: 1, Period: time.Minute, Overdraft: true}, Cost: 1}
	for _, tc := range []struct {
		name    string
		hits    []limiter.Hit
		checked []limiter.Outcome
		want    []limiter.Step
	}{
		{"nothing rejected", []limiter.Hit{plain, over}, []limiter.Outcome{{Allowed: true}, {Allowed: true}}, []limiter.Step{limiter.StepCheck, limiter.StepAll}},
		{"a blocking rejection", []limiter.Hit{plain, over}, []limiter.Outcome{{}, {Allowed: true}}, []limiter.Step{limiter.StepCheck}},
		{"only an overdraft rejection", []limiter.Hit{plain, over}, []limiter.Outcome{{Allowed: true}, {}}, []limiter.Step{limiter.StepCheck, limiter.StepReports}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var steps []limiter.Step
			_, err := limiter.CheckThenCount(limiter.Batch{AllOrNothing: true, Hits: tc.hits}, func(s limiter.Step, _ []limiter.Outcome) ([]limiter.Outcome, error) {
				steps = append(steps, s)
				return tc.checked, nil
			})
			if err != nil || !slices.Equal(steps, tc.want) {
				t.Errorf("steps %v (err %v), want %v", steps, err, tc.want)
			}
		})
	}
}
