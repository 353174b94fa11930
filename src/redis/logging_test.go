package redis

import (
	"context"
	"fmt"
	"testing"
	"time"
)

type recordedLog struct{ lines []string }

func (r *recordedLog) Infof(format string, args ...any) {
	r.lines = append(r.lines, "info: "+fmt.Sprintf(format, args...))
}

func (r *recordedLog) Warnf(format string, args ...any) {
	r.lines = append(r.lines, "warn: "+fmt.Sprintf(format, args...))
}

func TestLogAdapterLevels(t *testing.T) {
	tests := []struct {
		format string
		args   []any
		want   string
	}{
		{"sentinel: new master=%q addr=%q", []any{"mymaster", "127.0.0.1:7000"}, `info: sentinel: new master="mymaster" addr="127.0.0.1:7000"`},
		{"sentinel: GetMasterAddrByName name=%q failed: %s", []any{"mymaster", "i/o timeout"}, `warn: sentinel: GetMasterAddrByName name="mymaster" failed: i/o timeout`},
		{"autopipeline: recovered full-duplex write panic: %v\n", []any{"boom"}, "warn: autopipeline: recovered full-duplex write panic: boom"},
		{"redis: connection pool: %s", []any{"Error while dialing"}, "warn: redis: connection pool: Error while dialing"},
		{"%s 100%%", []any{"literal"}, "info: literal 100%"},
	}
	for _, tc := range tests {
		rec := &recordedLog{}
		newLogAdapter(rec, time.Now).Printf(context.Background(), tc.format, tc.args...)
		if len(rec.lines) != 1 || rec.lines[0] != tc.want {
			t.Errorf("Printf(%q) logged %q, want [%q]", tc.format, rec.lines, tc.want)
		}
	}
}

// While Redis is down go-redis reports every failed dial; one line per
// format per logEvery reaches the log, and the next says what was skipped.
func TestLogAdapterLimitsRepeats(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rec := &recordedLog{}
	a := newLogAdapter(rec, func() time.Time { return now })
	dial := "redis: connection pool: failed to dial after %d attempts: %v"
	steps := []struct {
		after  time.Duration
		format string
	}{
		{0, dial},
		{time.Second, dial},
		{time.Second, "sentinel: master %d moved: %v"}, // another kind: not held back
		{time.Second, dial},
		{logEvery, dial},
		{time.Second, dial},
	}
	for _, s := range steps {
		now = now.Add(s.after)
		a.Printf(context.Background(), s.format, 1, "refused")
	}
	want := []string{
		"warn: redis: connection pool: failed to dial after 1 attempts: refused",
		"info: sentinel: master 1 moved: refused",
		"warn: redis: connection pool: failed to dial after 1 attempts: refused (and 2 more like it since the last such line)",
	}
	if fmt.Sprint(rec.lines) != fmt.Sprint(want) {
		t.Errorf("logged:\n%q\nwant:\n%q", rec.lines, want)
	}
}
