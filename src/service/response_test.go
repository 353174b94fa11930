package service

import (
	"testing"
	"time"

	"github.com/openrls/ratelimit/src/limiter"
)

func TestUntilReset(t *testing.T) {
	for _, c := range []struct {
		name string
		out  limiter.Outcome
		want time.Duration
	}{
		{"allowed: when the counter is empty again", limiter.Outcome{Allowed: true, ResetAfter: time.Hour}, time.Hour},
		{"rejected: until a request like it passes", limiter.Outcome{ResetAfter: time.Hour, RetryAfter: 10 * time.Minute}, 10 * time.Minute},
		{"rejected without a wait: never retry now", limiter.Outcome{ResetAfter: time.Minute}, time.Minute},
	} {
		if got := untilReset(c.out); got != c.want {
			t.Errorf("%s: untilReset = %v, want %v", c.name, got, c.want)
		}
	}
}
