package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestEvalMatchesMemoryStore: a random schedule of hits, checks and
// refunds on every algorithm (and on fixed windows through EvalFixed, the
// increment-first path), decided through Eval's encoded state, gives the
// memory store's outcome at every step.
func TestEvalMatchesMemoryStore(t *testing.T) {
	mem := NewMemoryStore(MemoryOptions{SweepInterval: -1})
	defer mem.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	var rules []Rule
	for _, alg := range []Algorithm{FixedWindow, SlidingWindow, TokenBucket, SlidingLog, Concurrency} {
		for _, od := range []bool{false, true} {
			rules = append(rules, Rule{Algorithm: alg, Limit: 5, Period: 10 * time.Second, Overdraft: od, Burst: uint64(map[bool]int{true: 7}[alg == TokenBucket])})
		}
	}
	rules = append(rules, Rule{Algorithm: FixedWindow, Limit: 5, Period: 10 * time.Second, CountRejected: true})
	states := map[int][]byte{}
	counts := map[string]uint64{} // fixed windows: key:window -> count
	now := time.Unix(1_700_000_000, 0)
	for i := range 5000 {
		now = now.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
		ri := rng.IntN(len(rules))
		r, cost, refund := rules[ri], uint64(rng.IntN(8)), rng.IntN(5) == 0
		want, err := mem.Apply(context.Background(), Batch{Now: now, Hits: []Hit{{Key: fmt.Sprint(ri), Rule: r, Cost: cost, Refund: refund}}})
		if err != nil {
			t.Fatal(err)
		}
		var got Outcome
		if r.Algorithm == FixedWindow {
			w, _ := FixedWindowAt(now, r)
			k := fmt.Sprint(ri, ":", w)
			counts[k], got, _ = EvalFixed(counts[k], now, r, cost, refund)
		} else {
			var next []byte
			var write bool
			next, got, _, write = Eval(states[ri], now, r, cost, refund)
			if write {
				states[ri] = next
			}
		}
		if got != want[0] {
			t.Fatalf("step %d, rule %+v, cost %d, refund %v: Eval %+v, memory store %+v", i, r, cost, refund, got, want[0])
		}
	}
}

// TestDecodeStateRefusesOtherBytes: bytes of another algorithm, version or
// length are no state, never a panic.
func TestDecodeStateRefusesOtherBytes(t *testing.T) {
	good := encodeState(state{w: 3, x: 4, y: 5}, SlidingWindow)
	for _, b := range [][]byte{nil, {}, {1}, {2, byte(SlidingWindow)}, good[:10], append(good, 0), encodeState(state{w: 1}, TokenBucket),
		{encodedVersion, byte(SlidingLog), 1, 2, 3}} {
		if st := decodeState(b, SlidingWindow); st.w != 0 || st.x != 0 || st.y != 0 {
			t.Errorf("decodeState(%v) = %+v, want no state", b, st)
		}
		_ = decodeState(b, SlidingLog)
	}
	if st := decodeState(good, SlidingWindow); st.w != 3 || st.x != 4 || st.y != 5 {
		t.Errorf("round trip = %+v", st)
	}
}
