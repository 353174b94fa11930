package reload

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/openrls/ratelimit/src/config"
)

// Holder keeps the config being served and swaps in new ones atomically: a
// request that loaded the old one finishes on it, the next one sees the new
// one. A failed load never replaces a good config. Holder is safe for
// concurrent use; its zero value holds no config.
type Holder struct {
	current   atomic.Pointer[config.Config]
	loadedAt  atomic.Int64 // when current was installed (unix ns)
	successes atomic.Uint64
	failures  atomic.Uint64
	mu        sync.Mutex // serialises loads, so an older build never wins
	onLoad    func(*config.Config, error)
}

// NewHolder returns an empty Holder. onLoad, if not nil, is called after
// every load attempt with the new config or the error (for logs and metrics).
func NewHolder(onLoad func(*config.Config, error)) *Holder {
	return &Holder{onLoad: onLoad}
}

// Load returns the config being served, or nil before the first good load.
func (h *Holder) Load() *config.Config { return h.current.Load() }

// Install builds a config and serves it if the build succeeds.
func (h *Holder) Install(build func() (*config.Config, error)) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	cfg, err := build()
	if err == nil && cfg == nil {
		err = errors.New("config: build returned nothing")
	}
	if err != nil {
		h.failures.Add(1)
	} else {
		h.current.Store(cfg)
		h.loadedAt.Store(time.Now().UnixNano())
		h.successes.Add(1)
	}
	if h.onLoad != nil {
		h.onLoad(cfg, err)
	}
	return err
}

// LoadedAt returns when the config being served was installed (zero
// before the first).
func (h *Holder) LoadedAt() time.Time {
	if ns := h.loadedAt.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// Counts returns how many loads succeeded and failed so far
// (config_load_success, config_load_error).
func (h *Holder) Counts() (successes, failures uint64) {
	return h.successes.Load(), h.failures.Load()
}
