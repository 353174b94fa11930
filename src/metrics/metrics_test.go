package metrics

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

func TestHitClassification(t *testing.T) {
	r := New(Options{NearLimitRatio: 0.5})
	rule := r.Rule("d", "k", false, "k")
	tests := []struct {
		hits, used, limit uint64
		allowed, shadow   bool
	}{
		{1, 1, 10, true, false},   // within
		{2, 6, 10, true, false},   // near (6 >= 5)
		{3, 10, 10, false, false}, // over
		{4, 10, 10, false, true},  // over, shadowed
	}
	for _, tc := range tests {
		r.Hit(rule, tc.hits, tc.used, tc.limit, tc.allowed, tc.shadow)
	}
	if got, want := rule.values(), [5]uint64{10, 7, 2, 3, 4}; got != want {
		t.Errorf("counters = %v, want total/over/near/within/shadow %v", got, want)
	}
}

func TestDetailedSeriesAreCapped(t *testing.T) {
	r := New(Options{MaxDetailedSeries: 2})
	a := r.Rule("d", "k_1", true, "k")
	b := r.Rule("d", "k_2", true, "k")
	c := r.Rule("d", "k_3", true, "k")
	if a.Key != "k_1" || b.Key != "k_2" || c.Key != "k" {
		t.Errorf("keys = %s %s %s, want k_1 k_2 and the fallback k", a.Key, b.Key, c.Key)
	}
	if again := r.Rule("d", "k_1", true, "k"); again != a {
		t.Error("an existing detailed series was not reused")
	}
}

func TestStatsd(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	r := New(Options{})
	rule := r.Rule("mongo_cps", "database_users", false, "database_users")
	r.Hit(rule, 3, 3, 10, true, false)
	r.Hit(rule, 1, 10, 10, false, false)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- r.RunStatsd(ctx, StatsdOptions{Addr: pc.LocalAddr().String(), Interval: time.Hour, Tags: map[string]string{"env": "test"}})
	}()
	cancel() // flushes once on the way out
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	_ = pc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	n, _, err := pc.ReadFrom(buf)
	if err != nil {
		t.Fatal(err)
	}
	got := string(buf[:n])
	for _, want := range []string{
		"ratelimit.service.rate_limit.mongo_cps.database_users.total_hits.__env=test:4|c",
		"ratelimit.service.rate_limit.mongo_cps.database_users.over_limit.__env=test:1|c",
		"ratelimit.service.rate_limit.mongo_cps.database_users.within_limit.__env=test:3|c",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("statsd packet %q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "shadow_mode") {
		t.Errorf("statsd sent an unchanged counter: %q", got)
	}
}
