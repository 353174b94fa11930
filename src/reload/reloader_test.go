package reload

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/openrls/ratelimit/src/config"
)

// TestReloader: a first load from files that stops start-up is not logged
// (its error is returned); a failed reload is logged one entry per error,
// at most maxLoggedErrors and a count; a success is logged and closes
// First.
func TestReloader(t *testing.T) {
	log, hook := test.NewNullLogger()
	r := NewReloader(log)
	dir := t.TempDir()
	bad := func() (*config.Config, error) { return nil, errors.New("a.yaml:1: one\na.yaml:2: two") }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := r.WatchFiles(ctx, WatchOptions{Dir: dir}, bad, true); err == nil {
		t.Fatal("a failing first load returned no error")
	}
	if n := len(hook.AllEntries()); n != 0 {
		t.Errorf("a first load that stops start-up logged %d entries, want none (its error is the exit message)", n)
	}
	select {
	case <-r.First():
		t.Fatal("First closed with no config served")
	default:
	}
	if err := r.Install(bad); err == nil {
		t.Fatal("a failing load returned no error")
	}
	entries := hook.AllEntries()
	if len(entries) != 2 || entries[0].Data["error"] != "a.yaml:1: one" || entries[1].Data["errors"] != 2 ||
		!strings.Contains(entries[0].Message, "no config is serving yet") {
		t.Errorf("a failing load with nothing served logged %v, want one entry per error", entries)
	}
	hook.Reset()
	f, err := config.Parse("a.yaml", []byte("domain: a\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	good := func() (*config.Config, error) { return config.Build([]*config.File{f}, config.Options{}) }
	if err := r.Install(good); err != nil {
		t.Fatal(err)
	}
	<-r.First()
	if e := hook.LastEntry(); e == nil || e.Level != logrus.InfoLevel || e.Message != "config loaded" {
		t.Errorf("a good load logged %v, want \"config loaded\"", e)
	}
	var many []string
	for i := range maxLoggedErrors + 7 {
		many = append(many, fmt.Sprintf("a.yaml:%d: wrong", i+1))
	}
	hook.Reset()
	_ = r.Install(func() (*config.Config, error) { return nil, errors.New(strings.Join(many, "\n")) })
	entries = hook.AllEntries()
	if len(entries) != maxLoggedErrors+1 || !strings.Contains(entries[0].Message, "the last good config keeps serving") ||
		entries[maxLoggedErrors].Data["error"] != "and 7 more (config-check lists them all)" {
		t.Errorf("a reload with %d errors logged %d entries (last %v), want %d and a count", len(many), len(entries), hook.LastEntry(), maxLoggedErrors+1)
	}
	if r.Holder().Load() == nil {
		t.Error("a failed reload lost the config being served")
	}
}
