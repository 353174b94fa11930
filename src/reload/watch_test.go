package reload

import (
	"context"
	"errors"
	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/config/configtest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestHolderKeepsLastGoodConfig(t *testing.T) {
	var seen []error
	h := NewHolder(func(_ *config.Config, err error) { seen = append(seen, err) })
	if h.Load() != nil {
		t.Fatal("new Holder serves a config")
	}
	good := mustBuild(t, "domain: a\n")
	if err := h.Install(func() (*config.Config, error) { return good, nil }); err != nil {
		t.Fatal(err)
	}
	if err := h.Install(func() (*config.Config, error) { return nil, errors.New("bad file") }); err == nil {
		t.Fatal("Install(failing build) = nil error")
	}
	if h.Load() != good {
		t.Errorf("after a failed load, Load() is not the last good config")
	}
	if ok, failed := h.Counts(); ok != 1 || failed != 1 || len(seen) != 2 || seen[1] == nil {
		t.Errorf("Counts() = %d, %d; onLoad saw %v; want 1, 1 and two calls", ok, failed, seen)
	}
}

func limitConfig(domain string, rpu int) string {
	return "domain: " + domain + "\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: " + strconv.Itoa(rpu) + "}\n"
}

func write(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestWatchReloads(t *testing.T) {
	tests := []struct {
		name      string
		watchRoot bool
		setup     func(t *testing.T, base string) (root, dir string)
		change    func(t *testing.T, base string)
	}{
		{"in-place edit", false,
			func(t *testing.T, base string) (string, string) {
				write(t, filepath.Join(base, "cfg", "a.yaml"), limitConfig("a", 1))
				return base, filepath.Join(base, "cfg")
			},
			func(t *testing.T, base string) { write(t, filepath.Join(base, "cfg", "a.yaml"), limitConfig("a", 2)) }},
		{"new file by rename", false,
			func(t *testing.T, base string) (string, string) {
				write(t, filepath.Join(base, "cfg", "a.yaml"), limitConfig("a", 1))
				return base, filepath.Join(base, "cfg")
			},
			func(t *testing.T, base string) {
				write(t, filepath.Join(base, "staging.tmp"), limitConfig("a", 2))
				if err := os.Rename(filepath.Join(base, "staging.tmp"), filepath.Join(base, "cfg", "a.yaml")); err != nil {
					t.Fatal(err)
				}
			}},
		{"root symlink swap", true,
			func(t *testing.T, base string) (string, string) {
				write(t, filepath.Join(base, "v1", "config", "a.yaml"), limitConfig("a", 1))
				configtest.SwapLink(t, filepath.Join(base, "v1"), filepath.Join(base, "current"))
				return filepath.Join(base, "current"), filepath.Join(base, "current", "config")
			},
			func(t *testing.T, base string) {
				write(t, filepath.Join(base, "v2", "config", "a.yaml"), limitConfig("a", 2))
				configtest.SwapLink(t, filepath.Join(base, "v2"), filepath.Join(base, "current"))
			}},
		{"edit of a linked file's target elsewhere (make run)", false,
			func(t *testing.T, base string) (string, string) {
				write(t, filepath.Join(base, "examples", "a.yaml"), limitConfig("a", 1))
				if err := os.MkdirAll(filepath.Join(base, "cfg"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(filepath.Join(base, "examples", "a.yaml"), filepath.Join(base, "cfg", "a.yaml")); err != nil {
					t.Fatal(err)
				}
				return base, filepath.Join(base, "cfg")
			},
			func(t *testing.T, base string) {
				write(t, filepath.Join(base, "examples", "a.yaml"), limitConfig("a", 2))
			}},
		{"configmap ..data swap, watching the root", true,
			func(t *testing.T, base string) (string, string) {
				configtest.ConfigMap(t, filepath.Join(base, "cfg"), "..2026_01", map[string]string{"a.yaml": limitConfig("a", 1)})
				return base, filepath.Join(base, "cfg")
			},
			func(t *testing.T, base string) {
				configtest.ConfigMap(t, filepath.Join(base, "cfg"), "..2026_02", map[string]string{"a.yaml": limitConfig("a", 2)})
			}},
		{"configmap ..data swap, watching the directory", false,
			func(t *testing.T, base string) (string, string) {
				configtest.ConfigMap(t, filepath.Join(base, "cfg"), "..2026_01", map[string]string{"a.yaml": limitConfig("a", 1)})
				return base, filepath.Join(base, "cfg")
			},
			func(t *testing.T, base string) {
				configtest.ConfigMap(t, filepath.Join(base, "cfg"), "..2026_02", map[string]string{"a.yaml": limitConfig("a", 2)})
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			root, dir := tc.setup(t, base)
			loaded := make(chan *config.Config, 16)
			h := NewHolder(func(c *config.Config, err error) {
				if err == nil {
					loaded <- c
				}
			})
			reload := func() error {
				return h.Install(func() (*config.Config, error) { return config.LoadDir(dir, false, config.Options{}) })
			}
			if err := reload(); err != nil {
				t.Fatal(err)
			}
			<-loaded
			w, err := newWatcher(WatchOptions{Dir: dir, Root: root, WatchRoot: tc.watchRoot, Debounce: 20 * time.Millisecond, Reload: reload})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { w.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			tc.change(t, base)
			deadline := time.After(10 * time.Second)
			for {
				select {
				case c := <-loaded:
					if strings.Contains(dump(c), "a.k: 2 per second") {
						return
					}
				case <-deadline:
					t.Fatalf("no reload with the new limit within 10s; serving:\n%s", dump(h.Load()))
				}
			}
		})
	}
}

func TestWatchRelevant(t *testing.T) {
	o := WatchOptions{Dir: "/srv/runtime_data/current/ratelimit/config", Root: "/srv/runtime_data/current", WatchRoot: true}
	tests := []struct {
		path string
		want bool
	}{
		{"/srv/runtime_data/current/ratelimit/config/a.yaml", true},
		{"/srv/runtime_data/current/ratelimit/config/..data", true},
		{"/srv/runtime_data/current/ratelimit/config/..2026_01/a.yaml", true},
		{"/srv/runtime_data/current/ratelimit/config", true},
		{"/srv/runtime_data/current", true},           // the root symlink swapped
		{"/srv/runtime_data/current/ratelimit", true}, // a missing directory created
		{"/srv/runtime_data/current.tmp", false},      // the swap's staging link
		{"/srv/runtime_data/other.log", false},        // a neighbour of the root
		{"/srv/runtime_data/current/ratelimit/configs", false},
		{"/srv/runtime_data/current/ratelimit/config2/a.yaml", false},
		{"/srv/runtime_data/current/ratelimit/config/b.yml", true},
		{"/srv/runtime_data/current/ratelimit/config/tenants", true},     // a directory, or once one
		{"/srv/runtime_data/current/ratelimit/config/.a.yaml.swp", true}, // read too (RUNTIME_IGNOREDOTFILES aside)
		{"/srv/runtime_data/current/ratelimit/config/a.yaml~", true},
		{"/srv/runtime_data/current/ratelimit/config/notes.txt", true},
	}
	for _, tc := range tests {
		if got := o.relevant(tc.path); got != tc.want {
			t.Errorf("relevant(%q) = %v, want %v", tc.path, got, tc.want)
		}
	}
	if rel := (WatchOptions{Dir: "rt/ratelimit/config"}); !rel.relevant("rt") || !rel.relevant("rt/ratelimit/config/a.yaml") || rel.relevant("rtx") {
		t.Error("relative paths: want rt and files in the directory relevant, rtx not")
	}
}

// TestWatchBoundsTheWait: a reload arrives while files keep changing. A
// config file rewritten faster than the debounce reloads within MaxWait
// (every file in the directory is config: config.FindFiles). Each writer stops once the
// reload arrives, or after 10 s: the old watcher waited for the writes to
// pause, which made the reload arrive only after the writer stopped.
func TestWatchBoundsTheWait(t *testing.T) {
	for _, tc := range []struct {
		name    string
		noise   string // rewritten every 10 ms
		edit    string // written once
		maxWait time.Duration
	}{
		{"config rewritten without pause", "a.yaml", "", 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, filepath.Join(dir, "a.yaml"), limitConfig("a", 1))
			reloads := make(chan struct{}, 64)
			w, err := newWatcher(WatchOptions{Dir: dir, Debounce: 50 * time.Millisecond, MaxWait: tc.maxWait,
				Reload: func() error { reloads <- struct{}{}; return nil }})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go w.Run(ctx)
			if tc.edit != "" {
				write(t, filepath.Join(dir, tc.edit), limitConfig("a", 2))
			}
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			stop := time.After(10 * time.Second)
			for i := 0; ; i++ {
				select {
				case <-reloads:
					return // while the writes went on
				case <-stop:
					t.Fatal("no reload within 10 s of writes every 10 ms")
				case <-tick.C:
					write(t, filepath.Join(dir, tc.noise), limitConfig("a", 3+i))
				}
			}
		})
	}
}

// mustBuild builds a config of one file holding src.
func mustBuild(t testing.TB, src string) *config.Config {
	t.Helper()
	f, err := config.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	c, err := config.Build([]*config.File{f}, config.Options{})
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return c
}

// dump is the config's /rlconfig text.
func dump(c *config.Config) string {
	var b strings.Builder
	_ = c.WriteDump(&b)
	return b.String()
}

// TestSlowReloadsAreSpaced: with a file rewritten every 10 ms and each
// reload taking 400 ms, the next reload waits reloadSpacing times that
// after it: reloads keep coming, but take at most a quarter of the time.
// (Without the spacing they ran back to back, MaxWait passing during each.)
func TestSlowReloadsAreSpaced(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), limitConfig("a", 1))
	var mu sync.Mutex
	var spans [][2]time.Time // each reload's start and end
	w, err := newWatcher(WatchOptions{Dir: dir, Debounce: 20 * time.Millisecond, MaxWait: 100 * time.Millisecond,
		Reload: func() error {
			began := time.Now()
			time.Sleep(400 * time.Millisecond) // the reload's work
			mu.Lock()
			spans = append(spans, [2]time.Time{began, time.Now()})
			mu.Unlock()
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for i := 0; i < 1000; i++ { // 10 s of writes, at most
		<-tick.C
		write(t, filepath.Join(dir, "a.yaml"), limitConfig("a", 2+i))
		mu.Lock()
		n := len(spans)
		mu.Unlock()
		if n >= 3 {
			break
		}
	}
	cancel()
	mu.Lock()
	defer mu.Unlock()
	if len(spans) < 3 {
		t.Fatalf("%d reloads in 10 s of writes, want them to keep coming", len(spans))
	}
	for i := 1; i < len(spans); i++ {
		took := spans[i-1][1].Sub(spans[i-1][0])
		// The watcher measures the reload a little longer than it ran.
		if gap := spans[i][0].Sub(spans[i-1][1]); gap < reloadSpacing*took {
			t.Errorf("reload %d began %v after the one before ended, which took %v: want at least %d times that", i+1, gap, took, reloadSpacing)
		}
	}
}
