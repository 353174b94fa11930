package main

import (
	"context"
	"errors"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/reload"
	"github.com/openrls/ratelimit/src/server"
	"github.com/openrls/ratelimit/src/settings"
	"github.com/openrls/ratelimit/src/xds"
)

// startConfig loads the first config and keeps it current in the background
// (file watching or xDS) until ctx ends. Unless FORCE_START_WITHOUT_INITIAL_CONFIG,
// it returns only once a first config is being served.
func startConfig(ctx context.Context, s settings.Settings, log logrus.FieldLogger, health *server.Health) (*reload.Holder, error) {
	r := reload.NewReloader(log)
	if s.HealthyWithAtLeastOneConfigLoaded {
		health.AddCheck("config", func() error {
			if len(r.Holder().Load().Domains()) == 0 {
				return errors.New("no rate limit config loaded")
			}
			return nil
		})
	}
	opts := s.ConfigOptions()
	opts.Skipped = func(path string, why error) {
		log.WithField("file", path).WithError(why).Warn("skipping a config entry that is not a regular file")
	}
	opts.Noted = func(path, note string) {
		log.WithField("file", path).Warn(note)
	}
	start := startFiles
	if strings.EqualFold(s.ConfigType, "GRPC_XDS_SOTW") {
		start = startXDS
	}
	if err := start(ctx, s, log, r, opts); err != nil {
		return nil, err
	}
	return r.Holder(), nil
}

// startXDS subscribes to the xDS server and, unless
// FORCE_START_WITHOUT_INITIAL_CONFIG, waits for its first config.
func startXDS(ctx context.Context, s settings.Settings, log logrus.FieldLogger, r *reload.Reloader, opts config.Options) error {
	xo, err := s.XDSOptions()
	if err != nil {
		return err
	}
	xo.Install, xo.Build, xo.Logger = r.Install, opts, log.WithField("xds", s.XDSServerURL)
	go func() { _ = xds.Run(ctx, xo) }()
	if s.ForceStartWithoutInitialConfig {
		return nil
	}
	log.WithField("server", s.XDSServerURL).Info("waiting for the first config from xDS")
	select {
	case <-r.First():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// startFiles loads the config directory and watches it; a first load that
// fails stops start-up unless FORCE_START_WITHOUT_INITIAL_CONFIG.
func startFiles(ctx context.Context, s settings.Settings, _ logrus.FieldLogger, r *reload.Reloader, opts config.Options) error {
	dir := s.ConfigDir()
	load := func() (*config.Config, error) { return config.LoadDir(dir, s.RuntimeIgnoreDotFiles, opts) }
	wo := reload.WatchOptions{Dir: dir, Root: s.RuntimeRoot, WatchRoot: s.RuntimeWatchRoot}
	if err := r.WatchFiles(ctx, wo, load, !s.ForceStartWithoutInitialConfig); err != nil && !s.ForceStartWithoutInitialConfig {
		return s.ConfigLoadError(err)
	}
	return nil
}
