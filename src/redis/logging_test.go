package redis

import (
	"context"
	"fmt"
	"testing"
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
		logAdapter{rec}.Printf(context.Background(), tc.format, tc.args...)
		if len(rec.lines) != 1 || rec.lines[0] != tc.want {
			t.Errorf("Printf(%q) logged %q, want [%q]", tc.format, rec.lines, tc.want)
		}
	}
}
