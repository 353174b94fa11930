package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/server"
	"github.com/openrls/ratelimit/src/settings"
	"github.com/openrls/ratelimit/src/xds"
)

// startConfig loads the first config and keeps it current in the background
// (file watching or xDS) until ctx ends. Unless FORCE_START_WITHOUT_INITIAL_CONFIG,
// it returns only once a first config is being served.
func startConfig(ctx context.Context, s settings.Settings, log logrus.FieldLogger, health *server.Health) (*config.Holder, error) {
	first := make(chan struct{})
	var once sync.Once
	var holder *config.Holder
	// firstFile is set during the first load from files when its failure
	// stops start-up: the error is the process's exit message then, not a
	// log line as well.
	var firstFile atomic.Bool
	holder = config.NewHolder(func(cfg *config.Config, err error) {
		if err != nil {
			if firstFile.Load() {
				return
			}
			if holder.Load() == nil {
				log.WithError(err).Error("config load failed; no config is serving yet")
			} else {
				log.WithError(err).Error("config load failed; the last good config keeps serving")
			}
			return
		}
		log.WithFields(logrus.Fields{"domains": cfg.Domains(), "version": cfg.Version()}).Info("config loaded")
		once.Do(func() { close(first) })
	})
	if s.HealthyWithAtLeastOneConfigLoaded {
		health.AddCheck("config", func() error {
			if len(holder.Load().Domains()) == 0 {
				return errors.New("no rate limit config loaded")
			}
			return nil
		})
	}
	// Every load, from files or xDS, with the collector tight (tightGC).
	install := func(build func() (*config.Config, error)) error {
		return holder.Install(func() (*config.Config, error) { return tightGC(holder.Load() != nil, build) })
	}
	wildcards, _ := config.ParseWildcardPrecedence(s.WildcardPrecedence) // validated by settings
	opts := config.Options{MergeDomains: s.MergeDomainConfig, HashValues: s.CacheKeyHashValues, MaxDepth: s.RequestMaxEntries,
		Wildcards: wildcards,
		Skipped: func(path string, why error) {
			log.WithField("file", path).WithError(why).Warn("skipping a config entry that is not a regular file")
		}}

	if strings.EqualFold(s.ConfigType, "GRPC_XDS_SOTW") {
		xo := xds.Options{ServerURL: s.XDSServerURL, NodeID: s.XDSNodeID, RetryInterval: s.XDSConnectRetryInterval,
			Backoff: xds.Backoff{Initial: s.XDSBackoffInitial, Max: s.XDSBackoffMax, RandomFactor: s.XDSBackoffRandomFactor,
				Jitter: s.XDSBackoffJitter},
			NodeMetadata: s.XDSMetadata(), Headers: s.XDSHeaders(), MaxMsgSize: s.XDSMaxMsgSize,
			Install: install, Build: opts, Logger: log.WithField("xds", s.XDSServerURL)}
		if s.XDSServerUseTLS {
			dial, err := xds.TLSDialOption(xds.TLSOptions{CAFile: s.XDSServerTLSCA, CertFile: s.XDSClientTLSCert,
				KeyFile: s.XDSClientTLSKey, ServerName: s.XDSServerTLSSAN})
			if err != nil {
				return nil, err
			}
			xo.DialOptions = []grpc.DialOption{dial}
		}
		go func() { _ = xds.Run(ctx, xo) }()
		if !s.ForceStartWithoutInitialConfig {
			log.WithField("server", s.XDSServerURL).Info("waiting for the first config from xDS")
			select {
			case <-first:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return holder, nil
	}

	dir := s.ConfigDir()
	reload := func() error {
		return install(func() (*config.Config, error) { return config.LoadDir(dir, s.RuntimeIgnoreDotFiles, opts) })
	}
	w, err := config.NewWatcher(config.WatchOptions{Dir: dir, Root: s.RuntimeRoot, WatchRoot: s.RuntimeWatchRoot, Reload: reload})
	if err != nil {
		return nil, err
	}
	go w.Run(ctx)
	firstFile.Store(!s.ForceStartWithoutInitialConfig)
	err = reload()
	firstFile.Store(false)
	if err != nil && !s.ForceStartWithoutInitialConfig {
		return nil, fmt.Errorf("load config from %s: %w", dir, err)
	}
	return holder, nil
}
