package redis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/openrls/ratelimit/src/logthrottle"
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
func RouteLogs(log Logger) { goredis.SetLogger(newLogAdapter(log, time.Now)) }

// logEvery is how often one kind of go-redis line may be logged. While Redis
// is down go-redis reports every failed dial, one per request, and the
// service already logs the failure itself (at most once per 5 s).
const logEvery = 5 * time.Second

type logAdapter struct {
	log Logger
	now func() time.Time

	mu   sync.Mutex
	seen map[string]*logthrottle.Throttle // by format: go-redis's formats are constants
}

func newLogAdapter(log Logger, now func() time.Time) *logAdapter {
	return &logAdapter{log: log, now: now, seen: map[string]*logthrottle.Throttle{}}
}

// Printf implements go-redis's logging interface. go-redis has no levels:
// lines that report a failure are warnings, the rest information. Repeats
// of one format within logEvery are counted, not logged; the next line
// says how many there were.
func (a *logAdapter) Printf(_ context.Context, format string, args ...any) {
	a.mu.Lock()
	th := a.seen[format]
	if th == nil {
		th = &logthrottle.Throttle{Every: logEvery}
		a.seen[format] = th
	}
	a.mu.Unlock()
	suppressed, ok := th.Due(a.now())
	if !ok {
		return
	}

	msg := strings.TrimSpace(fmt.Sprintf(format, args...))
	lower := strings.ToLower(msg)
	if suppressed > 0 {
		msg += fmt.Sprintf(" (and %d more like it since the last such line)", suppressed)
	}
	if strings.Contains(lower, "fail") || strings.Contains(lower, "error") || strings.Contains(lower, "panic") {
		a.log.Warnf("%s", msg)
		return
	}
	a.log.Infof("%s", msg)
}
