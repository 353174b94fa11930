package rlqs

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

// TestAReplicaReadsItsPartLikeAgainstLike: a replica's part of a limit is
// what it published to the push window read over that window's total. A
// replica alone whose demand falls keeps the whole limit (read against
// its demand now, 5 Envoys on 300 a minute were granted 278 of 290 tokens
// every few rounds), as does one that exchanges twice in one window;
// replicas together split it by their demands, a newcomer by its demand
// now against the others'.
func TestAReplicaReadsItsPartLikeAgainstLike(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	type step struct {
		at      time.Duration // into the run
		replica int
		demand  float64 // requests per second
		want    float64 // its part after the exchange
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"alone, demand falling", []step{
			{0, 0, 4, 1}, {time.Second, 0, 3.6, 1}, {2 * time.Second, 0, 2, 1}, {3 * time.Second, 0, 1.5, 1}}},
		{"alone, twice in a window", []step{
			{0, 0, 4, 1}, {300 * time.Millisecond, 0, 4, 1}, {time.Second, 0, 4, 1}, {2 * time.Second, 0, 4, 1}}},
		{"two, steady", []step{
			{0, 0, 3, 1}, {0, 1, 1, 1}, // nothing to read yet: the store bounds them
			{time.Second, 0, 3, 3.0 / 4}, {time.Second, 1, 1, 1.0 / 4},
			{2 * time.Second, 0, 3, 3.0 / 4}, {2 * time.Second, 1, 1, 1.0 / 4}}},
		{"a newcomer", []step{
			{0, 0, 3, 1}, {time.Second, 0, 3, 1}, {time.Second, 1, 1, 1.0 / 4},
			{2 * time.Second, 0, 3, 3.0 / 4}, {2 * time.Second, 1, 1, 1.0 / 4}}},
		{"no demand, no part", []step{{0, 0, 3, 1}, {time.Second, 0, 0, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
			var services [2]*Service
			var pools [2]*pool
			var buckets [2]*bucket
			for i := range services {
				services[i] = New(Options{Store: store})
				pools[i] = &pool{key: "k", rule: limiter.Rule{Algorithm: limiter.FixedWindow, Limit: 300, Period: time.Minute},
					members: map[*member]struct{}{}, frac: 1}
				buckets[i] = &bucket{}
				pools[i].members[&member{b: buckets[i], p: pools[i]}] = struct{}{}
				owned(t, services[i], func(g *state) { g.pools["k"] = pools[i] })
			}
			for k, st := range tc.steps {
				buckets[st.replica].demand = st.demand / 1.1 // want() asks 1.1 times its demand
				services[st.replica].exchangeDemand(context.Background(), t0.Add(st.at))
				if got := pools[st.replica].frac; math.Abs(got-st.want) > 1e-3 {
					t.Errorf("step %d (replica %d at %v): part %.4f, want %.4f", k, st.replica, st.at, got, st.want)
				}
			}
		})
	}
}
