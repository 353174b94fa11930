package reload

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// WatchOptions says what a Watcher watches.
type WatchOptions struct {
	// Dir is the config directory; it and every directory below it are
	// watched, Kubernetes' ..data links included, so writes, creates,
	// renames, removes and ConfigMap swaps all trigger a reload.
	//
	// A file in it that is a link to a file elsewhere (make run links the
	// example config) is followed: the target's directory is watched too, and
	// a change to the target reloads.
	Dir string
	// Root, with WatchRoot, is RUNTIME_ROOT: its parent directory is watched
	// too, so that swapping the root symlink triggers a reload.
	Root      string
	WatchRoot bool
	// Debounce is how long events must pause before a reload; 0 means 100ms.
	// Editors and ConfigMap updates produce bursts of events.
	Debounce time.Duration
	// MaxWait bounds how long a burst may postpone its reload: a change
	// applies within it however often files keep changing, unless the
	// reloads themselves are slow (see Run). 0 means 1s.
	MaxWait time.Duration
	// Reload is called after each burst. Its error is only reported through
	// its own channels: the Watcher goes on watching.
	Reload func() error
}

// watcher reloads the config when its files change.
type watcher struct {
	o       WatchOptions
	w       *fsnotify.Watcher
	targets map[string]bool // link targets outside Dir, as of the last arm
}

// newWatcher starts watching at once: a change made after it returns is seen
// by Run, even one made before Run starts.
func newWatcher(o WatchOptions) (*watcher, error) {
	if o.Debounce == 0 {
		o.Debounce = 100 * time.Millisecond
	}
	if o.MaxWait == 0 {
		o.MaxWait = time.Second
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("config watch: %w", err)
	}
	return &watcher{o: o, w: w, targets: o.arm(w)}, nil
}

// reloadSpacing is how many times a reload's own duration must pass
// before the next may start: reloads then take at most a quarter of a
// core, however often files change: a large directory with one file
// rewritten without pause otherwise reloaded every MaxWait, each reload
// reading every file.
const reloadSpacing = 3

// Run reloads after each burst of changes until ctx ends, then releases the
// watches. Every reload re-arms them, because a symlink swap replaces the
// directories being watched. A burst reloads once events pause for
// Debounce, and at the latest MaxWait after its first event, but never
// sooner than reloadSpacing times the last reload's duration after it
// ended.
func (wt *watcher) Run(ctx context.Context) {
	o, w := wt.o, wt.w
	defer w.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var burst time.Time     // the first event of the pending burst; zero when none is pending
	var notBefore time.Time // the earliest the next reload may start
	schedule := func() {
		now := time.Now()
		if burst.IsZero() {
			burst = now
		}
		timer.Reset(max(min(o.Debounce, burst.Add(o.MaxWait).Sub(now)), notBefore.Sub(now)))
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if o.relevant(ev.Name) || wt.targets[filepath.Clean(ev.Name)] {
				schedule()
			}
		case _, ok := <-w.Errors:
			if !ok {
				return
			}
			// An overflowed queue may have lost events: reload to be sure.
			schedule()
		case <-timer.C:
			burst = time.Time{}
			began := time.Now()
			wt.targets = o.arm(w)
			_ = o.Reload()
			notBefore = time.Now().Add(reloadSpacing * time.Since(began))
		}
	}
}

// relevant reports whether a change to path can change the config: path is
// on the way to the config directory (the root symlink, or a missing
// directory's parents), the directory itself, or anything inside it, since
// every file there is read (config.FindFiles). The root's parent is watched for
// the root symlink only; other files there (say, RUNTIME_ROOT=/tmp/rt with
// /tmp busy) must not reload the config on every write.
func (o WatchOptions) relevant(path string) bool {
	path, dir := filepath.Clean(path), filepath.Clean(o.Dir)
	if path == dir || !o.within(path) {
		return o.within(path)
	}
	return true
}

// within reports whether path is the config directory, inside it, or on
// the way to it.
func (o WatchOptions) within(path string) bool {
	path, dir := filepath.Clean(path), filepath.Clean(o.Dir)
	sep := string(filepath.Separator)
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, sep)+sep) ||
		strings.HasPrefix(dir, strings.TrimSuffix(path, sep)+sep)
}

// arm replaces the watch list with the directories as they are now: the
// root's parent (for a root symlink swap), the config directory and every
// directory or directory link below it, and the directory of every file
// link's target outside it. A missing config directory is covered by
// watching its nearest existing parent. It returns those link targets.
func (o WatchOptions) arm(w *fsnotify.Watcher) map[string]bool {
	for _, p := range w.WatchList() {
		_ = w.Remove(p)
	}
	if o.WatchRoot && o.Root != "" {
		_ = w.Add(filepath.Dir(filepath.Clean(o.Root)))
	}
	targets := map[string]bool{}
	_ = filepath.WalkDir(o.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // vanished mid-walk: its removal is an event, which re-arms
		}
		if d.IsDir() {
			_ = w.Add(path)
		} else if fi, err := os.Stat(path); err == nil && fi.IsDir() {
			_ = w.Add(path) // a link to a directory, such as ConfigMap's ..data
		} else if err == nil && d.Type()&fs.ModeSymlink != 0 {
			if target, err := filepath.EvalSymlinks(path); err == nil && !o.within(target) {
				targets[target] = true
				_ = w.Add(filepath.Dir(target))
			}
		}
		return nil
	})
	for dir := filepath.Clean(o.Dir); ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(dir); err == nil {
			_ = w.Add(dir)
			return targets
		}
		if dir == filepath.Dir(dir) {
			return targets
		}
	}
}
