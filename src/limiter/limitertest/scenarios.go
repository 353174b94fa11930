package limitertest

import (
	"time"
	_ "time/tzdata" // the zones of calendarScenarios, wherever the suite runs

	"github.com/openrls/ratelimit/src/limiter"
)

// The step tables every store must pass (Scenarios), beside the runner in
// limitertest.go.

func rule(a limiter.Algorithm, limit uint64, period time.Duration) limiter.Rule {
	return limiter.Rule{Algorithm: a, Limit: limit, Period: period}
}

func hit(key string, r limiter.Rule, cost uint64) limiter.Hit {
	return limiter.Hit{Key: key, Rule: r, Cost: cost}
}

func ok(rem uint64, reset time.Duration) limiter.Outcome {
	return limiter.Outcome{Allowed: true, Remaining: rem, ResetAfter: reset}
}

func no(rem uint64, reset, retry time.Duration) limiter.Outcome {
	return limiter.Outcome{Remaining: rem, ResetAfter: reset, RetryAfter: retry}
}

// over is a rejected hit that was counted anyway (CountRejected,
// overdraft on a fixed window), its count excess past the limit.
func over(excess uint64, reset, retry time.Duration) limiter.Outcome {
	return limiter.Outcome{ResetAfter: reset, RetryAfter: retry, Excess: excess}
}

const ms = time.Millisecond

// Scenarios returns the suite's step tables.
func Scenarios() []Scenario {
	fixed := rule(limiter.FixedWindow, 10, time.Minute)
	sliding := rule(limiter.SlidingWindow, 10, time.Minute)
	bucket := rule(limiter.TokenBucket, 10, time.Minute)
	burst3 := bucket
	burst3.Burst = 3
	one := rule(limiter.FixedWindow, 1, time.Minute)
	five := rule(limiter.FixedWindow, 5, time.Minute)
	fixedOD, slidingOD, bucketOD := overdraft(fixed), overdraft(sliding), overdraft(bucket)
	scs := append(usageScenarios(fixed, sliding, bucket, burst3, fixedOD, slidingOD, bucketOD, one, five), logScenarios()...)
	scs = append(scs, countRejectedScenarios()...)
	scs = append(scs, concurrencyScenarios()...)
	scs = append(scs, calendarScenarios()...)
	return append(scs, []Scenario{
		{"fixed/window_and_boundary", []Step{
			{At: 0, Hits: []limiter.Hit{hit("k", fixed, 1)}, Want: []limiter.Outcome{ok(9, 60*time.Second)}},
			{At: 10 * time.Second, Hits: []limiter.Hit{hit("k", fixed, 8)}, Want: []limiter.Outcome{ok(1, 50*time.Second)}},
			{At: 20 * time.Second, Hits: []limiter.Hit{hit("k", fixed, 2)}, Want: []limiter.Outcome{no(1, 40*time.Second, 40*time.Second)}},
			{At: 20 * time.Second, Hits: []limiter.Hit{hit("k", fixed, 1)}, Want: []limiter.Outcome{ok(0, 40*time.Second)}},
			{At: 30 * time.Second, Hits: []limiter.Hit{hit("k", fixed, 0)}, Want: []limiter.Outcome{ok(0, 30*time.Second)}},
			{At: 60*time.Second - ms, Hits: []limiter.Hit{hit("k", fixed, 1)}, Want: []limiter.Outcome{no(0, ms, ms)}},
			{At: 60 * time.Second, Hits: []limiter.Hit{hit("k", fixed, 3)}, Want: []limiter.Outcome{ok(7, 60*time.Second)}},
		}},
		{"fixed/cost_above_limit", []Step{
			{At: 5 * time.Second, Hits: []limiter.Hit{hit("k", fixed, 11)}, Want: []limiter.Outcome{no(10, 55*time.Second, 55*time.Second)}},
			{At: 5 * time.Second, Hits: []limiter.Hit{hit("k", fixed, 1<<62)}, Want: []limiter.Outcome{no(10, 55*time.Second, 55*time.Second)}},
			{At: 5 * time.Second, Hits: []limiter.Hit{hit("k", fixed, 10)}, Want: []limiter.Outcome{ok(0, 55*time.Second)}},
		}},
		{"zero_limit_rejects_everything", []Step{
			{Hits: []limiter.Hit{hit("f", rule(limiter.FixedWindow, 0, time.Second), 1)}, Want: []limiter.Outcome{no(0, time.Second, time.Second)}},
			{Hits: []limiter.Hit{hit("f", rule(limiter.FixedWindow, 0, time.Second), 0)}, Want: []limiter.Outcome{no(0, time.Second, time.Second)}},
			{Hits: []limiter.Hit{hit("s", rule(limiter.SlidingWindow, 0, time.Second), 1)}, Want: []limiter.Outcome{no(0, 0, time.Second)}},
			{Hits: []limiter.Hit{hit("t", rule(limiter.TokenBucket, 0, time.Second), 1)}, Want: []limiter.Outcome{no(0, 0, time.Second)}},
		}},
		{"sliding/weighted_previous_window", []Step{
			{At: 0, Hits: []limiter.Hit{hit("k", sliding, 6)}, Want: []limiter.Outcome{ok(4, 120*time.Second)}},
			{At: 60 * time.Second, Hits: []limiter.Hit{hit("k", sliding, 4)}, Want: []limiter.Outcome{ok(0, 120*time.Second)}},
			{At: 60 * time.Second, Hits: []limiter.Hit{hit("k", sliding, 1)}, Want: []limiter.Outcome{no(0, 120*time.Second, 9961*ms)}},
			{At: 60*time.Second + 9960*ms, Hits: []limiter.Hit{hit("k", sliding, 1)}, Want: []limiter.Outcome{no(0, 110040*ms, ms)}},
			{At: 60*time.Second + 9961*ms, Hits: []limiter.Hit{hit("k", sliding, 1)}, Want: []limiter.Outcome{ok(0, 110039*ms)}},
			{At: 150 * time.Second, Hits: []limiter.Hit{hit("k", sliding, 1)}, Want: []limiter.Outcome{ok(6, 90*time.Second)}},
			{At: 300 * time.Second, Hits: []limiter.Hit{hit("k", sliding, 2)}, Want: []limiter.Outcome{ok(8, 120*time.Second)}},
		}},
		{"sliding/no_double_burst_at_boundary", []Step{
			{At: 59 * time.Second, Hits: []limiter.Hit{hit("k", sliding, 10)}, Want: []limiter.Outcome{ok(0, 61*time.Second)}},
			{At: 60 * time.Second, Hits: []limiter.Hit{hit("k", sliding, 1)}, Want: []limiter.Outcome{no(0, time.Minute, 5941*ms)}},
			{At: 65940 * ms, Hits: []limiter.Hit{hit("k", sliding, 1)}, Want: []limiter.Outcome{no(0, 54060*ms, ms)}},
			{At: 65941 * ms, Hits: []limiter.Hit{hit("k", sliding, 1)}, Want: []limiter.Outcome{ok(0, 114059*ms)}},
			{At: 59 * time.Second, Hits: []limiter.Hit{hit("f", fixed, 10)}, Want: []limiter.Outcome{ok(0, time.Second)}},
			{At: 60 * time.Second, Hits: []limiter.Hit{hit("f", fixed, 10)}, Want: []limiter.Outcome{ok(0, time.Minute)}},
		}},
		{"sliding/current_window_full", []Step{
			{At: 30 * time.Second, Hits: []limiter.Hit{hit("k", sliding, 10)}, Want: []limiter.Outcome{ok(0, 90*time.Second)}},
			// Needs the 10 to become the previous window and decay to 9.
			{At: 30 * time.Second, Hits: []limiter.Hit{hit("k", sliding, 1)}, Want: []limiter.Outcome{no(0, 90*time.Second, 35941*ms)}},
		}},
		{"token_bucket/refill", []Step{
			{At: 0, Hits: []limiter.Hit{hit("k", bucket, 10)}, Want: []limiter.Outcome{ok(0, 60*time.Second)}},
			{At: 0, Hits: []limiter.Hit{hit("k", bucket, 1)}, Want: []limiter.Outcome{no(0, 60*time.Second, 6*time.Second)}},
			{At: 6 * time.Second, Hits: []limiter.Hit{hit("k", bucket, 1)}, Want: []limiter.Outcome{ok(0, 60*time.Second)}},
			{At: 30 * time.Second, Hits: []limiter.Hit{hit("k", bucket, 0)}, Want: []limiter.Outcome{ok(4, 36*time.Second)}},
			{At: 30 * time.Second, Hits: []limiter.Hit{hit("k", bucket, 5)}, Want: []limiter.Outcome{no(4, 36*time.Second, 6*time.Second)}},
			{At: 30 * time.Second, Hits: []limiter.Hit{hit("k", bucket, 4)}, Want: []limiter.Outcome{ok(0, 60*time.Second)}},
			{At: 200 * time.Second, Hits: []limiter.Hit{hit("k", bucket, 1)}, Want: []limiter.Outcome{ok(9, 6*time.Second)}},
		}},
		{"token_bucket/burst", []Step{
			{At: 0, Hits: []limiter.Hit{hit("k", burst3, 3)}, Want: []limiter.Outcome{ok(0, 18*time.Second)}},
			{At: 0, Hits: []limiter.Hit{hit("k", burst3, 1)}, Want: []limiter.Outcome{no(0, 18*time.Second, 6*time.Second)}},
			{At: 0, Hits: []limiter.Hit{hit("k", burst3, 4)}, Want: []limiter.Outcome{no(0, 18*time.Second, 18*time.Second)}},
			{At: 12 * time.Second, Hits: []limiter.Hit{hit("k", burst3, 2)}, Want: []limiter.Outcome{ok(0, 18*time.Second)}},
		}},
		{"batch/all_or_nothing", []Step{
			{Hits: []limiter.Hit{hit("a", one, 1)}, Want: []limiter.Outcome{ok(0, time.Minute)}},
			{AllOrNothing: true, Hits: []limiter.Hit{hit("b", five, 1), hit("a", one, 1)},
				Want: []limiter.Outcome{ok(5, time.Minute), no(0, time.Minute, time.Minute)}},
			{Hits: []limiter.Hit{hit("b", five, 0)}, Want: []limiter.Outcome{ok(5, time.Minute)}},
			{Hits: []limiter.Hit{hit("b", five, 1), hit("a", one, 1)},
				Want: []limiter.Outcome{ok(4, time.Minute), no(0, time.Minute, time.Minute)}},
			{AllOrNothing: true, Hits: []limiter.Hit{hit("b", five, 1), {Key: "a", Rule: one, Cost: 1, Advisory: true}},
				Want: []limiter.Outcome{ok(3, time.Minute), no(0, time.Minute, time.Minute)}},
			{Hits: []limiter.Hit{hit("b", five, 0)}, Want: []limiter.Outcome{ok(3, time.Minute)}},
		}},
		{"batch/dry_run", []Step{
			{Hits: []limiter.Hit{hit("a", one, 1)}, Want: []limiter.Outcome{ok(0, time.Minute)}},
			// Decided as if counted; the allowed hit reports what a cost of 0 sees.
			{DryRun: true, Hits: []limiter.Hit{hit("b", five, 2), hit("a", one, 1)},
				Want: []limiter.Outcome{ok(5, time.Minute), no(0, time.Minute, time.Minute)}},
			{DryRun: true, Hits: []limiter.Hit{hit("b", five, 6)}, Want: []limiter.Outcome{no(5, time.Minute, time.Minute)}},
			{DryRun: true, AllOrNothing: true, Hits: []limiter.Hit{hit("b", five, 5)}, Want: []limiter.Outcome{ok(5, time.Minute)}},
			// Nothing was written.
			{Hits: []limiter.Hit{hit("b", five, 0)}, Want: []limiter.Outcome{ok(5, time.Minute)}},
		}},
		{"batch/same_key_twice", []Step{
			{Hits: []limiter.Hit{hit("k", rule(limiter.FixedWindow, 3, time.Second), 2), hit("k", rule(limiter.FixedWindow, 3, time.Second), 2), hit("k", rule(limiter.FixedWindow, 3, time.Second), 1)},
				Want: []limiter.Outcome{ok(1, time.Second), no(1, time.Second, time.Second), ok(0, time.Second)}},
		}},
		{"batch/independent_keys_and_algorithms", []Step{
			{Hits: []limiter.Hit{hit("x", fixed, 4), hit("y", sliding, 4), hit("z", bucket, 4)},
				Want: []limiter.Outcome{ok(6, time.Minute), ok(6, 2*time.Minute), ok(6, 24*time.Second)}},
		}},
	}...)
}

func overdraft(r limiter.Rule) limiter.Rule {
	r.Overdraft = true
	return r
}

func countRejected(r limiter.Rule) limiter.Rule {
	r.CountRejected = true
	return r
}

// countRejectedScenarios are envoyproxy/ratelimit's counting
// (Rule.CountRejected): every hit counts, a check passes at exactly the
// limit. The first two are its integration scripts token-quota.sh and
// multiservice-tokenquota.sh, by their decisions, and 1,000 tokens an hour
// reported 300 at a time.
func countRejectedScenarios() []Scenario {
	const m = time.Minute
	two := countRejected(rule(limiter.FixedWindow, 2, m))
	one := countRejected(rule(limiter.FixedWindow, 1, m))
	tokens := countRejected(rule(limiter.FixedWindow, 1000, time.Hour))
	zero := countRejected(rule(limiter.FixedWindow, 0, m))
	check := func(key string, r limiter.Rule, want limiter.Outcome) Step {
		return Step{At: 10 * time.Second, Hits: []limiter.Hit{hit(key, r, 0)}, Want: []limiter.Outcome{want}}
	}
	report := func(key string, r limiter.Rule, cost uint64, want limiter.Outcome) Step {
		return Step{At: 10 * time.Second, Hits: []limiter.Hit{hit(key, r, cost)}, Want: []limiter.Outcome{want}}
	}
	const r50, r3590 = 50 * time.Second, 3590 * time.Second
	return []Scenario{
		{"count_rejected/check_then_report", []Step{
			check("s2", two, ok(2, r50)), report("s2", two, 1, ok(1, r50)),
			check("s2", two, ok(1, r50)), report("s2", two, 1, ok(0, r50)),
			// At exactly the limit a check passes; the report past it counts.
			check("s2", two, ok(0, r50)), report("s2", two, 1, over(1, r50, r50)),
			check("s2", two, no(0, r50, r50)),
			{At: m, Hits: []limiter.Hit{hit("s2", two, 0)}, Want: []limiter.Outcome{ok(2, m)}},
		}},
		{"count_rejected/multiservice", []Step{
			// Request 1: both checked, service 1 reports; request 2 the same.
			{At: 10 * time.Second, Hits: []limiter.Hit{hit("s1", one, 0), hit("s2", two, 0)}, Want: []limiter.Outcome{ok(1, r50), ok(2, r50)}},
			report("s1", one, 1, ok(0, r50)),
			{At: 10 * time.Second, Hits: []limiter.Hit{hit("s1", one, 0), hit("s2", two, 0)}, Want: []limiter.Outcome{ok(0, r50), ok(2, r50)}},
			report("s1", one, 1, over(1, r50, r50)),
			// Service 1 is out; service 2 serves three more.
			check("s1", one, no(0, r50, r50)),
		}},
		{"count_rejected/tokens", []Step{
			check("t", tokens, ok(1000, r3590)), report("t", tokens, 300, ok(700, r3590)),
			check("t", tokens, ok(700, r3590)), report("t", tokens, 300, ok(400, r3590)),
			check("t", tokens, ok(400, r3590)), report("t", tokens, 300, ok(100, r3590)),
			check("t", tokens, ok(100, r3590)), report("t", tokens, 300, over(200, r3590, r3590)),
			check("t", tokens, no(0, r3590, r3590)),
		}},
		{"count_rejected/all_or_nothing", []Step{
			report("a", one, 1, ok(0, r50)),
			// a is rejected and counted; b, allowed, is not counted.
			{At: 10 * time.Second, AllOrNothing: true, Hits: []limiter.Hit{hit("b", two, 1), hit("a", one, 1)},
				Want: []limiter.Outcome{ok(2, r50), over(1, r50, r50)}},
			{At: 10 * time.Second, Hits: []limiter.Hit{hit("b", two, 0), hit("a", one, 0)},
				Want: []limiter.Outcome{ok(2, r50), no(0, r50, r50)}},
			// A refund of 1 leaves a at 1 of 1: only a count of 2 was there.
			{At: 10 * time.Second, Hits: []limiter.Hit{refund("a", one, 1)}, Want: []limiter.Outcome{ok(0, r50)}},
			check("a", one, ok(0, r50)),
		}},
		{"count_rejected/limit_zero", []Step{
			check("z", zero, ok(0, r50)),
			report("z", zero, 1, over(1, r50, r50)),
			check("z", zero, no(0, r50, r50)),
		}},
		{"count_rejected/huge_cost", []Step{
			report("h", tokens, 1<<62, over(1<<42-1000, r3590, r3590)),
			report("h", tokens, 1<<62, over(1<<42-1000, r3590, r3590)),
			{At: time.Hour, Hits: []limiter.Hit{hit("h", tokens, 1)}, Want: []limiter.Outcome{ok(999, time.Hour)}},
		}},
	}
}

func refund(key string, r limiter.Rule, cost uint64) limiter.Hit {
	return limiter.Hit{Key: key, Rule: r, Cost: cost, Refund: true}
}

// logScenarios are the sliding log's: exact spans, weighted hits, refunds
// and overdraft.
func logScenarios() []Scenario {
	const s = time.Second
	log3 := rule(limiter.SlidingLog, 3, time.Minute)
	od := overdraft(log3)
	return []Scenario{
		{"sliding_log/never_more_than_the_limit_in_any_span", []Step{
			{At: 0, Hits: []limiter.Hit{hit("k", log3, 1)}, Want: []limiter.Outcome{ok(2, 60*s)}},
			{At: 10 * s, Hits: []limiter.Hit{hit("k", log3, 1)}, Want: []limiter.Outcome{ok(1, 50*s)}},
			{At: 20 * s, Hits: []limiter.Hit{hit("k", log3, 1)}, Want: []limiter.Outcome{ok(0, 40*s)}},
			// Free when the hit at 0 leaves the window.
			{At: 30 * s, Hits: []limiter.Hit{hit("k", log3, 1)}, Want: []limiter.Outcome{no(0, 30*s, 30*s)}},
			{At: 60 * s, Hits: []limiter.Hit{hit("k", log3, 1)}, Want: []limiter.Outcome{ok(0, 10*s)}},
			{At: 60 * s, Hits: []limiter.Hit{hit("k", log3, 1)}, Want: []limiter.Outcome{no(0, 10*s, 10*s)}},
			{At: 70*s - ms, Hits: []limiter.Hit{hit("k", log3, 1)}, Want: []limiter.Outcome{no(0, ms, ms)}},
			{At: 70 * s, Hits: []limiter.Hit{hit("k", log3, 1)}, Want: []limiter.Outcome{ok(0, 10*s)}},
		}},
		{"sliding_log/weighted_hits_and_refunds", []Step{
			{At: 0, Hits: []limiter.Hit{hit("w", log3, 2)}, Want: []limiter.Outcome{ok(1, 60*s)}},
			{At: 1 * s, Hits: []limiter.Hit{hit("w", log3, 2)}, Want: []limiter.Outcome{no(1, 59*s, 59*s)}},
			{At: 1 * s, Hits: []limiter.Hit{hit("w", log3, 4)}, Want: []limiter.Outcome{no(1, 59*s, 60*s)}},
			{At: 2 * s, Hits: []limiter.Hit{refund("w", log3, 1)}, Want: []limiter.Outcome{ok(2, 58*s)}},
			{At: 2 * s, Hits: []limiter.Hit{refund("u", log3, 3)}, Want: []limiter.Outcome{ok(3, 0)}},
			{At: 2 * s, Hits: []limiter.Hit{refund("w", log3, 5)}, Want: []limiter.Outcome{ok(3, 0)}},
			{At: 2 * s, Hits: []limiter.Hit{hit("w", log3, 3)}, Want: []limiter.Outcome{ok(0, 60*s)}},
		}},
		{"sliding_log/overdraft", []Step{
			{At: 0, Hits: []limiter.Hit{hit("o", od, 5)}, Want: []limiter.Outcome{no(0, 60*s, 60*s)}},
			// Counted up to twice the limit.
			{At: 10 * s, Hits: []limiter.Hit{hit("o", od, 4)}, Want: []limiter.Outcome{no(0, 50*s, 50*s)}},
			{At: 10 * s, Hits: []limiter.Hit{refund("o", od, 4)}, Want: []limiter.Outcome{ok(1, 50*s)}},
			{At: 10 * s, Hits: []limiter.Hit{hit("o", od, 0)}, Want: []limiter.Outcome{ok(1, 50*s)}},
		}},
		{"sliding_log/all_or_nothing", []Step{
			{Hits: []limiter.Hit{hit("a", rule(limiter.FixedWindow, 1, time.Minute), 1)}, Want: []limiter.Outcome{ok(0, 60*s)}},
			{AllOrNothing: true, Hits: []limiter.Hit{hit("l", log3, 2), hit("a", rule(limiter.FixedWindow, 1, time.Minute), 1)},
				Want: []limiter.Outcome{ok(3, 0), no(0, 60*s, 60*s)}},
			{Hits: []limiter.Hit{hit("l", log3, 2), hit("l", log3, 2)}, Want: []limiter.Outcome{ok(1, 60*s), no(1, 60*s, 60*s)}},
		}},
	}
}

// calendarScenarios are windows on a zone's calendar: T0 is 12:00 on 15
// November 2023 in Pacific/Kiritimati (UTC+14), 22:00 on the 14th in UTC.
func calendarScenarios() []Scenario {
	const h = time.Hour
	kiritimati, err := time.LoadLocation("Pacific/Kiritimati")
	if err != nil {
		panic(err) // the zone database is built in (time/tzdata)
	}
	day := rule(limiter.FixedWindow, 2, 24*h)
	day.Calendar = &limiter.Calendar{Unit: limiter.CalendarDay, Zone: kiritimati}
	month := rule(limiter.SlidingWindow, 5, 30*24*h)
	month.Calendar = &limiter.Calendar{Unit: limiter.CalendarMonth, Zone: time.UTC}
	return []Scenario{
		{"calendar/a_day_ends_at_the_zones_midnight", []Step{
			{At: 0, Hits: []limiter.Hit{hit("d", day, 1)}, Want: []limiter.Outcome{ok(1, 12*h)}},
			{At: 12*h - ms, Hits: []limiter.Hit{hit("d", day, 1)}, Want: []limiter.Outcome{ok(0, ms)}},
			{At: 12*h - ms, Hits: []limiter.Hit{hit("d", day, 1)}, Want: []limiter.Outcome{no(0, ms, ms)}},
			{At: 12 * h, Hits: []limiter.Hit{hit("d", day, 1)}, Want: []limiter.Outcome{ok(1, 24*h)}},
		}},
		{"calendar/a_month_from_the_1st", []Step{
			// Its hits age out by the end of December: 16 days 2 hours,
			// then 31 days.
			{At: 0, Hits: []limiter.Hit{hit("m", month, 5)}, Want: []limiter.Outcome{ok(0, (16*24+2+31*24)*h)}},
			// Room again once a fifth of December (31 days) has passed, the
			// previous month's 5 then weighing 4: 16 days, then 148 hours,
			// 3 minutes and 21.601 seconds (the weight's whole thousandths).
			{At: 2 * h, Hits: []limiter.Hit{hit("m", month, 1)}, Want: []limiter.Outcome{no(0, (16*24+31*24)*h,
				(16*24+148)*h+3*time.Minute+21601*ms)}},
		}},
	}
}

// concurrencyScenarios are slots taken, given back oldest first, and
// freed by themselves once held for the rule's period.
func concurrencyScenarios() []Scenario {
	const s = time.Second
	slots := rule(limiter.Concurrency, 3, time.Minute)
	return []Scenario{
		{"concurrency/take_release_expire", []Step{
			{At: 0, Hits: []limiter.Hit{hit("c", slots, 1)}, Want: []limiter.Outcome{ok(2, 60*s)}},
			{At: 10 * s, Hits: []limiter.Hit{hit("c", slots, 1)}, Want: []limiter.Outcome{ok(1, 50*s)}},
			{At: 20 * s, Hits: []limiter.Hit{hit("c", slots, 1)}, Want: []limiter.Outcome{ok(0, 40*s)}},
			// The fourth takes none: free when the oldest slot is.
			{At: 20 * s, Hits: []limiter.Hit{hit("c", slots, 1)}, Want: []limiter.Outcome{no(0, 40*s, 40*s)}},
			// A release gives back the oldest slot (taken at 0).
			{At: 25 * s, Hits: []limiter.Hit{refund("c", slots, 1)}, Want: []limiter.Outcome{ok(1, 45*s)}},
			{At: 25 * s, Hits: []limiter.Hit{hit("c", slots, 1)}, Want: []limiter.Outcome{ok(0, 45*s)}},
			// The slot taken at 10 s and never given back is freed at 70 s.
			{At: 70*s - ms, Hits: []limiter.Hit{hit("c", slots, 1)}, Want: []limiter.Outcome{no(0, ms, ms)}},
			{At: 70 * s, Hits: []limiter.Hit{hit("c", slots, 1)}, Want: []limiter.Outcome{ok(0, 10*s)}},
			// Never more given back than is held, never below none.
			{At: 70 * s, Hits: []limiter.Hit{refund("c", slots, 5)}, Want: []limiter.Outcome{ok(3, 0)}},
			{At: 70 * s, Hits: []limiter.Hit{refund("c", slots, 1)}, Want: []limiter.Outcome{ok(3, 0)}},
			{At: 70 * s, Hits: []limiter.Hit{hit("c", slots, 4)}, Want: []limiter.Outcome{no(3, 0, 60*s)}},
		}},
		{"concurrency/weighted_release_of_the_oldest", []Step{
			{At: 0, Hits: []limiter.Hit{hit("w", slots, 2)}, Want: []limiter.Outcome{ok(1, 60*s)}},
			{At: 5 * s, Hits: []limiter.Hit{hit("w", slots, 1)}, Want: []limiter.Outcome{ok(0, 55*s)}},
			{At: 6 * s, Hits: []limiter.Hit{refund("w", slots, 1)}, Want: []limiter.Outcome{ok(1, 54*s)}},
			{At: 6 * s, Hits: []limiter.Hit{refund("w", slots, 1)}, Want: []limiter.Outcome{ok(2, 59*s)}},
			// A check takes nothing.
			{At: 7 * s, Hits: []limiter.Hit{hit("w", slots, 0)}, Want: []limiter.Outcome{ok(2, 58*s)}},
			{At: 7 * s, Hits: []limiter.Hit{hit("w", slots, 3)}, Want: []limiter.Outcome{no(2, 58*s, 58*s)}},
		}},
	}
}

// usageScenarios are refunds (is_negative_hits) and overdraft (usage
// reported after the fact) on every algorithm.
func usageScenarios(fixed, sliding, bucket, burst3, fixedOD, slidingOD, bucketOD, one, five limiter.Rule) []Scenario {
	const s = time.Second
	return []Scenario{
		{"refund/fixed", []Step{
			{At: 0, Hits: []limiter.Hit{hit("k", fixed, 6)}, Want: []limiter.Outcome{ok(4, 60*s)}},
			{At: 1 * s, Hits: []limiter.Hit{refund("k", fixed, 2)}, Want: []limiter.Outcome{ok(6, 59*s)}},
			// More than was used: back to empty, never below.
			{At: 2 * s, Hits: []limiter.Hit{refund("k", fixed, 100)}, Want: []limiter.Outcome{ok(10, 58*s)}},
			{At: 3 * s, Hits: []limiter.Hit{hit("k", fixed, 10)}, Want: []limiter.Outcome{ok(0, 57*s)}},
			// A refund of 0 is a check.
			{At: 3 * s, Hits: []limiter.Hit{refund("k", fixed, 0)}, Want: []limiter.Outcome{ok(0, 57*s)}},
			{At: 3 * s, Hits: []limiter.Hit{hit("k", fixed, 1)}, Want: []limiter.Outcome{no(0, 57*s, 57*s)}},
			// A key with no state: nothing changes.
			{At: 3 * s, Hits: []limiter.Hit{refund("u", fixed, 5), hit("u", fixed, 0)}, Want: []limiter.Outcome{ok(10, 57*s), ok(10, 57*s)}},
			// A refund of the previous window's hits gives nothing back in this one.
			{At: 60 * s, Hits: []limiter.Hit{refund("k", fixed, 5), hit("k", fixed, 0)}, Want: []limiter.Outcome{ok(10, 60*s), ok(10, 60*s)}},
		}},
		{"refund/sliding", []Step{
			{At: 0, Hits: []limiter.Hit{hit("k", sliding, 6)}, Want: []limiter.Outcome{ok(4, 120*s)}},
			{At: 60 * s, Hits: []limiter.Hit{hit("k", sliding, 2)}, Want: []limiter.Outcome{ok(2, 120*s)}},
			// From the current window first (2), then the previous one (3).
			{At: 60 * s, Hits: []limiter.Hit{refund("k", sliding, 5)}, Want: []limiter.Outcome{ok(7, 60*s)}},
			{At: 90 * s, Hits: []limiter.Hit{refund("k", sliding, 0)}, Want: []limiter.Outcome{ok(8, 30*s)}},
			{At: 90 * s, Hits: []limiter.Hit{refund("k", sliding, 50)}, Want: []limiter.Outcome{ok(10, 0)}},
		}},
		{"refund/token_bucket", []Step{
			{At: 0, Hits: []limiter.Hit{hit("k", bucket, 10)}, Want: []limiter.Outcome{ok(0, 60*s)}},
			{At: 0, Hits: []limiter.Hit{refund("k", bucket, 3)}, Want: []limiter.Outcome{ok(3, 42*s)}},
			// Never more than a full bucket.
			{At: 0, Hits: []limiter.Hit{refund("k", bucket, 100)}, Want: []limiter.Outcome{ok(10, 0)}},
			{At: 0, Hits: []limiter.Hit{refund("k", bucket, 1)}, Want: []limiter.Outcome{ok(10, 0)}},
			{At: 0, Hits: []limiter.Hit{hit("b", burst3, 3), refund("b", burst3, 5)}, Want: []limiter.Outcome{ok(0, 18*s), ok(3, 0)}},
			{At: 0, Hits: []limiter.Hit{hit("b", burst3, 3)}, Want: []limiter.Outcome{ok(0, 18*s)}},
		}},
		{"overdraft/fixed", []Step{
			{At: 0, Hits: []limiter.Hit{hit("k", fixedOD, 8)}, Want: []limiter.Outcome{ok(2, 60*s)}},
			// Does not fit: counted all the same, and rejected.
			{At: 1 * s, Hits: []limiter.Hit{hit("k", fixedOD, 5)}, Want: []limiter.Outcome{over(3, 59*s, 59*s)}},
			{At: 2 * s, Hits: []limiter.Hit{hit("k", fixedOD, 0)}, Want: []limiter.Outcome{no(0, 58*s, 58*s)}},
			// Refunds bring usage (13) back under the limit.
			{At: 3 * s, Hits: []limiter.Hit{refund("k", fixedOD, 4)}, Want: []limiter.Outcome{ok(1, 57*s)}},
			{At: 3 * s, Hits: []limiter.Hit{hit("k", fixedOD, 0)}, Want: []limiter.Outcome{ok(1, 57*s)}},
			{At: 3 * s, Hits: []limiter.Hit{hit("k", fixedOD, 1)}, Want: []limiter.Outcome{ok(0, 57*s)}},
			// At the limit a check is rejected: nothing is left.
			{At: 3 * s, Hits: []limiter.Hit{hit("k", fixedOD, 0)}, Want: []limiter.Outcome{no(0, 57*s, 57*s)}},
			{At: 60 * s, Hits: []limiter.Hit{hit("k", fixedOD, 1)}, Want: []limiter.Outcome{ok(9, 60*s)}},
			// Any cost is counted, bounded.
			{At: 60 * s, Hits: []limiter.Hit{hit("k", fixedOD, 1<<63)}, Want: []limiter.Outcome{over(1<<42-10, 60*s, 60*s)}},
		}},
		{"overdraft/sliding", []Step{
			{At: 0, Hits: []limiter.Hit{hit("k", slidingOD, 15)}, Want: []limiter.Outcome{no(0, 120*s, 83941*ms)}},
			{At: 83940 * ms, Hits: []limiter.Hit{hit("k", slidingOD, 0)}, Want: []limiter.Outcome{no(0, 36060*ms, ms)}},
			{At: 83941 * ms, Hits: []limiter.Hit{hit("k", slidingOD, 0)}, Want: []limiter.Outcome{ok(1, 36059*ms)}},
		}},
		{"overdraft/token_bucket", []Step{
			// 12 tokens from a bucket of 10: 2 in debt.
			{At: 0, Hits: []limiter.Hit{hit("k", bucketOD, 12)}, Want: []limiter.Outcome{no(0, 72*s, 12*s+time.Microsecond)}},
			{At: 12 * s, Hits: []limiter.Hit{hit("k", bucketOD, 0)}, Want: []limiter.Outcome{no(0, 60*s, time.Microsecond)}},
			{At: 18 * s, Hits: []limiter.Hit{hit("k", bucketOD, 0)}, Want: []limiter.Outcome{ok(1, 54*s)}},
			{At: 18 * s, Hits: []limiter.Hit{refund("k", bucketOD, 5)}, Want: []limiter.Outcome{ok(6, 24*s)}},
		}},
		{"overdraft/two_limits", []Step{
			{At: 0, Hits: []limiter.Hit{hit("m", fixedOD, 7), hit("h", overdraft(five), 7)},
				Want: []limiter.Outcome{ok(3, 60*s), over(2, 60*s, 60*s)}},
			{At: 0, Hits: []limiter.Hit{refund("m", fixedOD, 7), refund("h", overdraft(five), 3)},
				Want: []limiter.Outcome{ok(10, 60*s), ok(1, 60*s)}},
		}},
		// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT with overdraft: an
		// overdraft rejection alone counts the overdraft hits (and
		// refunds) and nothing else; any other rejection counts nothing.
		{"overdraft/all_or_nothing", []Step{
			{AllOrNothing: true, Hits: []limiter.Hit{hit("o", fixedOD, 12), hit("n", five, 1)},
				Want: []limiter.Outcome{over(2, 60*s, 60*s), ok(5, 60*s)}},
			{Hits: []limiter.Hit{hit("o", fixedOD, 0), hit("n", five, 0)}, Want: []limiter.Outcome{no(0, 60*s, 60*s), ok(5, 60*s)}},
			{Hits: []limiter.Hit{hit("one", one, 1)}, Want: []limiter.Outcome{ok(0, 60*s)}},
			{AllOrNothing: true, Hits: []limiter.Hit{refund("o", fixedOD, 5), hit("one", one, 1)},
				Want: []limiter.Outcome{ok(0, 60*s), no(0, 60*s, 60*s)}},
			{Hits: []limiter.Hit{hit("o", fixedOD, 0)}, Want: []limiter.Outcome{no(0, 60*s, 60*s)}},
			{AllOrNothing: true, Hits: []limiter.Hit{hit("p", fixedOD, 4), hit("one", one, 1)},
				Want: []limiter.Outcome{ok(10, 60*s), no(0, 60*s, 60*s)}},
		}},
	}
}
