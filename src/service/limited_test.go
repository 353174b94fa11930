package service

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/openrls/ratelimit/src/topk"
)

// TestLimitedSeriesBoundedOverTime: values limited in turn, a new one
// every scrape, make at most n series per window, not one per value, and
// the window after chooses afresh.
func TestLimitedSeriesBoundedOverTime(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	sketch := topk.New(64, time.Minute, clock)
	c := LimitedCollector(sketch, 3, time.Minute, clock)
	scrape := func() map[string]float64 {
		ch := make(chan prometheus.Metric, 16)
		c.Collect(ch)
		close(ch)
		out := map[string]float64{}
		for m := range ch {
			var pb dto.Metric
			if err := m.Write(&pb); err != nil {
				t.Fatal(err)
			}
			var labels []string
			for _, l := range pb.GetLabel() {
				labels = append(labels, l.GetValue())
			}
			out[strings.Join(labels, "/")] = pb.GetGauge().GetValue()
		}
		return out
	}
	seen := map[string]bool{}
	for i := range 50 { // a new value, limited more than any before, every scrape
		sketch.Add(limitedKey("d", "user", fmt.Sprintf("user=v%d", i)), uint64(10+i))
		got := scrape()
		if len(got) > 3 {
			t.Fatalf("scrape %d: %d series, want at most 3", i, len(got))
		}
		for k := range got {
			seen[k] = true
		}
		now = now.Add(time.Second)
	}
	if len(seen) != 3 {
		t.Errorf("%d distinct series in a window of 50 scrapes, want 3: %v", len(seen), seen)
	}
	now = now.Add(time.Minute)
	sketch.Add(limitedKey("d", "user", "user=late"), 1000)
	if got := scrape(); got["d/user/user=late"] != 1000 || len(got) != 3 {
		t.Errorf("the next window's first scrape: %v, want the heaviest, user=late, among 3", got)
	}
}
