package reload

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/sirupsen/logrus"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/memtrim"
)

// Reloader is how the service loads its config. Every load, from files or
// from xDS, goes through one Holder with the collector tightened while it
// runs (memtrim.DuringLoad); each outcome is logged; First is closed once
// a first config is served.
type Reloader struct {
	holder *Holder
	first  chan struct{}
	// quiet is set during a first load from files whose failure stops
	// start-up: its error is the process's exit message then, not a log
	// line as well.
	quiet atomic.Bool
}

// NewReloader makes the Holder, logging each load's outcome to log.
func NewReloader(log logrus.FieldLogger) *Reloader {
	r := &Reloader{first: make(chan struct{})}
	var once sync.Once
	r.holder = NewHolder(func(cfg *config.Config, err error) {
		if err != nil {
			if r.quiet.Load() {
				return
			}
			msg := "config load failed; the last good config keeps serving"
			if r.holder.Load() == nil {
				msg = "config load failed; no config is serving yet"
			}
			logEach(log, msg, err)
			return
		}
		log.WithFields(logrus.Fields{"domains": cfg.Domains(), "version": cfg.Version()}).Info("config loaded")
		once.Do(func() { close(r.first) })
	})
	return r
}

// Holder is what every load installs into, and what the service reads.
func (r *Reloader) Holder() *Holder { return r.holder }

// First is closed once a first config is served.
func (r *Reloader) First() <-chan struct{} { return r.first }

// Install runs one load, with the collector tight (memtrim.DuringLoad):
// tighter still on a reload, while the config being served stays in
// memory beside the new one.
func (r *Reloader) Install(build func() (*config.Config, error)) error {
	return r.holder.Install(func() (cfg *config.Config, err error) {
		memtrim.DuringLoad(r.holder.Load() != nil, func() { cfg, err = build() })
		return cfg, err
	})
}

// WatchFiles loads with load and reloads on every change wo's Watcher sees
// (wo.Reload is set here) until ctx ends. It returns the first load's
// error; with firstStops that error stops start-up, and is the caller's to
// report rather than logged.
func (r *Reloader) WatchFiles(ctx context.Context, wo WatchOptions, load func() (*config.Config, error), firstStops bool) error {
	wo.Reload = func() error { return r.Install(load) }
	w, err := newWatcher(wo)
	if err != nil {
		return err
	}
	go w.Run(ctx)
	r.quiet.Store(firstStops)
	err = wo.Reload()
	r.quiet.Store(false)
	return err
}

// logEach logs err's errors one entry each (a load reports every problem
// it found, joined by newlines): in one entry they would read as one line
// with literal \n between them in text logs, and as one string in JSON.
// At most maxLoggedErrors are logged, then how many more there were: a
// broken generated file can hold thousands, on every reload.
func logEach(log logrus.FieldLogger, msg string, err error) {
	lines := strings.Split(strings.TrimSpace(err.Error()), "\n")
	for i, line := range lines {
		e := log.WithField("error", line)
		if len(lines) > 1 {
			e = e.WithField("errors", len(lines))
		}
		if i == maxLoggedErrors {
			e.WithField("error", fmt.Sprintf("and %d more (config-check lists them all)", len(lines)-i)).Error(msg)
			return
		}
		e.Error(msg)
	}
}

const maxLoggedErrors = 50
