package topk

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestHeavyItemsTopTheList: a few hot keys in a flood of 100,000 distinct
// ones come out on top, each count bounding its true count from above and
// Count-Error from below; memory stays at Size counters a window.
func TestHeavyItemsTopTheList(t *testing.T) {
	at := time.Unix(1000, 0)
	s := New(256, time.Minute, func() time.Time { return at })
	rng := rand.New(rand.NewPCG(1, 2))
	truth := map[string]uint64{}
	hot := []string{"hot-a", "hot-b", "hot-c"}
	for i := range 100_000 {
		key := fmt.Sprintf("cold-%d", i)
		if rng.IntN(10) == 0 {
			key = hot[rng.IntN(len(hot))]
		}
		s.Add(key, 1)
		truth[key]++
	}
	top := s.Top(3)
	got := map[string]bool{}
	for _, it := range top {
		got[it.Key] = true
		if it.Count < truth[it.Key] || it.Count-it.Error > truth[it.Key] {
			t.Errorf("%s: count %d, error %d; true count %d is not within [count-error, count]", it.Key, it.Count, it.Error, truth[it.Key])
		}
	}
	for _, h := range hot {
		if !got[h] {
			t.Errorf("hot key %s not in the top 3: %v", h, top)
		}
	}
	held := 0
	for i := range s.shards {
		held += len(s.shards[i].cur.index)
	}
	if held > 256 {
		t.Errorf("%d counters held, want at most 256", held)
	}
}

// TestWindowsSlide: what was heavy two windows ago is forgotten; the
// previous window still counts.
func TestWindowsSlide(t *testing.T) {
	at := time.Unix(1000, 0)
	s := New(64, time.Minute, func() time.Time { return at })
	s.Add("old", 100)
	at = at.Add(time.Minute)
	s.Add("new", 5)
	if top := s.Top(2); len(top) != 2 || top[0].Key != "old" || top[0].Count != 100 || top[1].Key != "new" {
		t.Errorf("one window later: %v, want old (100) then new (5)", top)
	}
	at = at.Add(time.Minute)
	s.Add("newer", 1)
	if top := s.Top(5); len(top) != 2 || top[0].Key != "new" || top[1].Key != "newer" {
		t.Errorf("two windows later: %v, want new and newer only", top)
	}
	at = at.Add(10 * time.Minute)
	if top := s.Top(5); len(top) != 0 {
		t.Errorf("after a long quiet: %v, want nothing", top)
	}
}

func BenchmarkAdd(b *testing.B) {
	s := New(1024, time.Minute, nil)
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%d", i)
	}
	i := 0
	for b.Loop() {
		s.Add(keys[i%len(keys)], 1)
		i++
	}
}
