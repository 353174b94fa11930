package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// FindFiles lists the config files under dir: every *.yaml and *.yml file,
// recursively, sorted. Entries whose name starts with ".." are always skipped:
// they are the internals of a Kubernetes ConfigMap volume (..data and the
// timestamped directories), whose files are already visible through the
// top-level links and would otherwise be read twice. With ignoreDotfiles,
// every other name starting with "." is skipped too.
func FindFiles(dir string, ignoreDotfiles bool) ([]string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if path != dir && (strings.HasPrefix(name, "..") || ignoreDotfiles && strings.HasPrefix(name, ".")) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		if ext := filepath.Ext(name); ext == ".yaml" || ext == ".yml" {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list config files in %s: %w", dir, err)
	}
	sort.Strings(files)
	return files, nil
}

// LoadFiles reads, parses and builds the given files. Errors from every file
// are reported together.
func LoadFiles(paths []string, opts Options) (*Config, error) {
	var errs []error
	files := make([]*File, 0, len(paths))
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("read config: %w", err))
			continue
		}
		f, err := Parse(p, data)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		files = append(files, f)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return Build(files, opts)
}

// LoadDir is FindFiles followed by LoadFiles. A directory without config
// files is an error: during a ConfigMap update or a botched deploy it is far
// more likely a transient or a mistake than a wish to drop every limit.
func LoadDir(dir string, ignoreDotfiles bool, opts Options) (*Config, error) {
	paths, err := FindFiles(dir, ignoreDotfiles)
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("no config files (*.yaml, *.yml) in %s", dir)
	}
	return LoadFiles(paths, opts)
}
