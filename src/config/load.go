package config

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/openrls/ratelimit/src/regularfile"
)

// MaxFileBytes bounds one config file. 100,000 rules written out take
// about 10 MB. A file that Parse cannot decode in pieces (aliases, say) is
// decoded whole, into yaml.v3's node tree of about 35 times its size, so
// the bound is also what keeps a hostile file from taking gigabytes.
// Larger configs split into files, each parsed alone.
const MaxFileBytes = 16 << 20

// MaxConfigBytes bounds all the files of a config together: past it the
// config is refused (and the one serving kept), before the rest is read.
// Five files of MaxFileBytes took about 1 GB and 20 s to load; a config of
// 64 MiB is some 600,000 rules.
const MaxConfigBytes = 64 << 20

// TooLarge is the error of the file at which a config's files, read
// files of all, came to total bytes, past MaxConfigBytes.
func TooLarge(path string, read, all, total int) error {
	return &Error{File: path, Msg: fmt.Sprintf("the config's files total more than the %d bytes a config may hold by this one "+
		"(%d of %d files read, %d bytes); split the limits over several services or move files out", MaxConfigBytes, read, all, total)}
}

// ErrNotRegular says that a path named like a config file is not a regular
// file (or a link to one): a FIFO, socket or device.
var errNotRegular = regularfile.ErrNotRegular

// ReadFile reads one config file. It never blocks on a FIFO, a socket or a
// device: it opens without waiting for a writer, checks what it opened, and
// refuses anything but a regular file (ErrNotRegular) or one larger than
// MaxFileBytes.
func ReadFile(path string) ([]byte, error) {
	data, err := regularfile.Read(path, MaxFileBytes)
	var big *regularfile.TooLargeError
	switch {
	case errors.As(err, &big) && big.Grown:
		return nil, &Error{File: path, Msg: fmt.Sprintf("file grew past the %d bytes a config file may hold while being read", MaxFileBytes)}
	case errors.As(err, &big):
		return nil, &Error{File: path, Msg: fmt.Sprintf("file is %d bytes, over the %d a config file may hold", big.Size, MaxFileBytes)}
	case err != nil:
		return nil, fmt.Errorf("read config: %w", err)
	}
	return data, nil
}

// FindFiles lists the config files under dir: every file, recursively,
// sorted, whatever its name ends with, as envoyproxy/ratelimit reads its
// runtime directory (a ConfigMap's keys often have no extension). Entries
// whose name starts with ".." are always skipped:
// they are the internals of a Kubernetes ConfigMap volume (..data and the
// timestamped directories), whose files are already visible through the
// top-level links and would otherwise be read twice. With ignoreDotfiles,
// every other name starting with "." is skipped too. Entries that are not
// regular files or links to them (FIFOs, sockets, devices, dangling links)
// are left out and returned in skipped with the reason.
func FindFiles(dir string, ignoreDotfiles bool) (files []string, skipped map[string]error, err error) {
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
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
		if fi, err := os.Stat(path); err != nil || !fi.Mode().IsRegular() {
			if skipped == nil {
				skipped = map[string]error{}
			}
			if err == nil {
				err = fmt.Errorf("%w (%s)", errNotRegular, regularfile.Kind(fi.Mode()))
			}
			skipped[path] = err
			return nil
		}
		files = append(files, path)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("list config files in %s: %w", dir, err)
	}
	sort.Strings(files)
	return files, skipped, nil
}

// LoadFiles reads, parses and builds the given files. Errors from every file
// are reported together.
func LoadFiles(paths []string, opts Options) (*Config, error) {
	var errs []error
	files := make([]*File, 0, len(paths))
	total := 0
	for i, p := range paths {
		data, err := ReadFile(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if total += len(data); total > MaxConfigBytes {
			errs = append(errs, TooLarge(p, i+1, len(paths), total))
			break
		}
		f, err := Parse(editedName(p), data)
		if err != nil {
			errs = append(errs, err)
			if what, _ := Classify(data); what != "" {
				errs = append(errs, NotAConfig(p, what))
			}
			continue
		}
		if f.Ignored != "" && opts.Noted != nil {
			opts.Noted(f.Name, f.Ignored)
		}
		files = append(files, f)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return Build(files, opts)
}

// editedName is the name errors give the config file at p: p itself, or,
// when p is a link to a file outside p's directory, that file, which is
// the one a user edits (make run links the example config into its config
// directory, say). A link within the directory (a Kubernetes ConfigMap's
// entries point into its own ..data) keeps its own name.
func editedName(p string) string {
	if fi, err := os.Lstat(p); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		return p
	}
	target, err := filepath.EvalSymlinks(p)
	if err != nil {
		return p
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(p))
	if err != nil {
		return p
	}
	if rel, err := filepath.Rel(dir, target); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
		return p // within the directory (..data/… included)
	}
	return target
}

// LoadDir is FindFiles followed by LoadFiles. A directory without config
// files is an error: during a ConfigMap update or a botched deploy it is far
// more likely a transient or a mistake than a wish to drop every limit.
func LoadDir(dir string, ignoreDotfiles bool, opts Options) (*Config, error) {
	paths, skipped, err := FindFiles(dir, ignoreDotfiles)
	if err != nil {
		return nil, err
	}
	if opts.Skipped != nil {
		for _, p := range slices.Sorted(maps.Keys(skipped)) {
			opts.Skipped(p, skipped[p])
		}
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("no config files in %s", dir)
	}
	return LoadFiles(paths, opts)
}
