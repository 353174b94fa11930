package redis

import (
	"context"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// Logger is what RouteLogs writes to; logrus's loggers and entries are one.
type Logger interface {
	Infof(format string, args ...any)
	Warnf(format string, args ...any)
}

// RouteLogs sends go-redis's own log lines (Sentinel switching masters,
// failed dials, recovered panics) to log, so they come out in the service's
// format (LOG_FORMAT=json included) and obey LOG_LEVEL, instead of reaching
// stderr through the standard library's logger. go-redis keeps a single
// logger per process, so this is for main to call once.
func RouteLogs(log Logger) { goredis.SetLogger(logAdapter{log}) }

type logAdapter struct{ log Logger }

// Printf implements go-redis's logging interface. go-redis has no levels:
// lines that report a failure are warnings, the rest information.
func (a logAdapter) Printf(_ context.Context, format string, args ...any) {
	msg := strings.TrimSpace(fmt.Sprintf(format, args...))
	lower := strings.ToLower(msg)
	if strings.Contains(lower, "fail") || strings.Contains(lower, "error") || strings.Contains(lower, "panic") {
		a.log.Warnf("%s", msg)
		return
	}
	a.log.Infof("%s", msg)
}
