package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/sirupsen/logrus"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/memtrim"
	"github.com/openrls/ratelimit/src/server"
	"github.com/openrls/ratelimit/src/settings"
	"github.com/openrls/ratelimit/src/xds"
)

// startConfig loads the first config and keeps it current in the background
// (file watching or xDS) until ctx ends. Unless FORCE_START_WITHOUT_INITIAL_CONFIG,
// it returns only once a first config is being served.
func startConfig(ctx context.Context, s settings.Settings, log logrus.FieldLogger, health *server.Health) (*config.Holder, error) {
	l := newLoads(log)
	if s.HealthyWithAtLeastOneConfigLoaded {
		health.AddCheck("config", func() error {
			if len(l.holder.Load().Domains()) == 0 {
				return errors.New("no rate limit config loaded")
			}
			return nil
		})
	}
	opts := s.ConfigOptions()
	opts.Skipped = func(path string, why error) {
		log.WithField("file", path).WithError(why).Warn("skipping a config entry that is not a regular file")
	}
	start := startFiles
	if strings.EqualFold(s.ConfigType, "GRPC_XDS_SOTW") {
		start = startXDS
	}
	if err := start(ctx, s, log, l, opts); err != nil {
		return nil, err
	}
	return l.holder, nil
}

// loads is the holder every config load goes through and what its
// outcomes tell the log and start-up.
type loads struct {
	holder *config.Holder
	// first is closed when a first config is installed.
	first chan struct{}
	// firstFile is set during the first load from files when its failure
	// stops start-up: the error is the process's exit message then, not a
	// log line as well.
	firstFile atomic.Bool
}

// newLoads makes the holder, logging each load's outcome.
func newLoads(log logrus.FieldLogger) *loads {
	l := &loads{first: make(chan struct{})}
	var once sync.Once
	l.holder = config.NewHolder(func(cfg *config.Config, err error) {
		if err != nil {
			if l.firstFile.Load() {
				return
			}
			msg := "config load failed; the last good config keeps serving"
			if l.holder.Load() == nil {
				msg = "config load failed; no config is serving yet"
			}
			logEach(log, msg, err)
			return
		}
		log.WithFields(logrus.Fields{"domains": cfg.Domains(), "version": cfg.Version()}).Info("config loaded")
		once.Do(func() { close(l.first) })
	})
	return l
}

// install runs one load, from files or xDS, with the collector tight
// (memtrim.DuringLoad).
func (l *loads) install(build func() (*config.Config, error)) error {
	return l.holder.Install(func() (cfg *config.Config, err error) {
		memtrim.DuringLoad(l.holder.Load() != nil, func() { cfg, err = build() })
		return cfg, err
	})
}

// startXDS subscribes to the xDS server and, unless
// FORCE_START_WITHOUT_INITIAL_CONFIG, waits for its first config.
func startXDS(ctx context.Context, s settings.Settings, log logrus.FieldLogger, l *loads, opts config.Options) error {
	xo, err := s.XDSOptions()
	if err != nil {
		return err
	}
	xo.Install, xo.Build, xo.Logger = l.install, opts, log.WithField("xds", s.XDSServerURL)
	go func() { _ = xds.Run(ctx, xo) }()
	if s.ForceStartWithoutInitialConfig {
		return nil
	}
	log.WithField("server", s.XDSServerURL).Info("waiting for the first config from xDS")
	select {
	case <-l.first:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// startFiles loads the config directory and watches it; a first load that
// fails stops start-up unless FORCE_START_WITHOUT_INITIAL_CONFIG.
func startFiles(ctx context.Context, s settings.Settings, _ logrus.FieldLogger, l *loads, opts config.Options) error {
	dir := s.ConfigDir()
	reload := func() error {
		return l.install(func() (*config.Config, error) { return config.LoadDir(dir, s.RuntimeIgnoreDotFiles, opts) })
	}
	w, err := config.NewWatcher(config.WatchOptions{Dir: dir, Root: s.RuntimeRoot, WatchRoot: s.RuntimeWatchRoot, Reload: reload})
	if err != nil {
		return err
	}
	go w.Run(ctx)
	l.firstFile.Store(!s.ForceStartWithoutInitialConfig)
	err = reload()
	l.firstFile.Store(false)
	if err != nil && !s.ForceStartWithoutInitialConfig {
		if _, statErr := os.Stat(dir); errors.Is(statErr, fs.ErrNotExist) {
			return fmt.Errorf("the config directory %s does not exist: it is RUNTIME_ROOT (%q), RUNTIME_SUBDIRECTORY (%q) and "+
				"RUNTIME_APPDIRECTORY (%q) joined; set them so that it names the directory of the YAML files%s, "+
				"or FORCE_START_WITHOUT_INITIAL_CONFIG=true to start without a config",
				dir, s.RuntimeRoot, s.RuntimeSubdirectory, s.RuntimeAppDirectory, appDirHint(s))
		}
		return fmt.Errorf("load config from %s: %w", dir, err)
	}
	return nil
}

// appDirHint points out the common mistake of a RUNTIME_ROOT that already
// ends in the app directory, which is then appended a second time.
func appDirHint(s settings.Settings) string {
	if app := s.RuntimeAppDirectory; app != "" && filepath.Base(filepath.Clean(s.RuntimeRoot)) == app {
		return fmt.Sprintf(" (RUNTIME_ROOT already ends in %q, which RUNTIME_APPDIRECTORY appends again: "+
			"set RUNTIME_ROOT to its parent)", app)
	}
	return ""
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
