package service

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/openrls/ratelimit/src/topk"
)

// limitedEntry is one row of who is limited most.
type limitedEntry struct {
	Domain string `json:"domain"`
	Rule   string `json:"rule"`
	// Values are the descriptor's entries as its counter key holds them
	// (hashed where the config hashes them).
	Values string `json:"values"`
	// Count is how many requests it was answered OVER_LIMIT in the window
	// reported, at most; Count-Error at least.
	Count uint64 `json:"count"`
	Error uint64 `json:"error"`
}

// topLimited returns the n descriptors answered OVER_LIMIT most in sketch's
// windows.
func topLimited(sketch *topk.Sketch, n int) []limitedEntry {
	var out []limitedEntry
	for _, it := range sketch.Top(n) {
		d, r, v, ok := splitLimitedKey(it.Key)
		if !ok {
			continue
		}
		out = append(out, limitedEntry{Domain: d, Rule: r, Values: v, Count: it.Count, Error: it.Error})
	}
	return out
}

// LimitedHandler serves who is limited most: JSON by default, a table with
// ?format=table; ?n= rows (default 50, at most 1000).
func LimitedHandler(sketch *topk.Sketch, window time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := 50
		if s := r.URL.Query().Get("n"); s != "" {
			v, err := strconv.Atoi(s)
			if err != nil || v < 1 {
				http.Error(w, "n must be a positive number", http.StatusBadRequest)
				return
			}
			n = min(v, 1000)
		}
		rows := topLimited(sketch, n)
		if r.URL.Query().Get("format") == "table" {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprintf(w, "answered OVER_LIMIT most in the last %v to %v\n", window, 2*window)
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "COUNT\tDOMAIN\tRULE\tVALUES")
			for _, e := range rows {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", e.Count, e.Domain, e.Rule, e.Values)
			}
			_ = tw.Flush()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(struct {
			Window  string         `json:"window"`
			Limited []limitedEntry `json:"limited"`
		}{window.String(), rows})
	})
}

// limitedCollector exports the top n as ratelimit_limited_top{domain,rule,values}.
// The values exported are chosen for a whole window: the top n at its
// first scrape (free places filled by later ones), exported with their
// counts (0 once they fall out of the sketch) until the window ends. So at
// most n series a scrape, and n distinct ones a window, however fast the
// limited values change: a series per newly limited value per scrape would
// grow a time-series database without bound.
type limitedCollector struct {
	sketch *topk.Sketch
	n      int
	window time.Duration
	now    func() time.Time

	mu     sync.Mutex
	chosen []string // sketch keys, heaviest first at the time chosen
	since  time.Time
}

var limitedDesc = prometheus.NewDesc("ratelimit_limited_top",
	"Requests answered OVER_LIMIT in the last one to two TOP_LIMITED_WINDOWs, for the TOP_LIMITED_METRIC descriptors limited most "+
		"when the window's first scrape chose them (an upper bound).",
	[]string{"domain", "rule", "values"}, nil)

// LimitedCollector returns a collector of the top n limited descriptors:
// at most n series a scrape, and n new ones a window (see
// limitedCollector); now is its clock (nil: time.Now).
func LimitedCollector(sketch *topk.Sketch, n int, window time.Duration, now func() time.Time) prometheus.Collector {
	if now == nil {
		now = time.Now
	}
	return &limitedCollector{sketch: sketch, n: n, window: window, now: now}
}

func (c *limitedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- limitedDesc }

func (c *limitedCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	all := c.sketch.Top(1 << 30)
	if now.Sub(c.since) >= c.window {
		c.chosen, c.since = c.chosen[:0], now
	}
	// Free places (a window that began with fewer limited values) go to
	// the heaviest not chosen yet.
	for _, it := range all {
		if len(c.chosen) >= c.n {
			break
		}
		if !slices.Contains(c.chosen, it.Key) {
			c.chosen = append(c.chosen, it.Key)
		}
	}
	counts := make(map[string]uint64, len(all))
	for _, it := range all {
		counts[it.Key] = it.Count
	}
	for _, k := range c.chosen {
		if d, r, v, ok := splitLimitedKey(k); ok {
			ch <- prometheus.MustNewConstMetric(limitedDesc, prometheus.GaugeValue, float64(counts[k]), d, r, v)
		}
	}
}
