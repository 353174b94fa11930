package service

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/openrls/ratelimit/src/config"
	"github.com/openrls/ratelimit/src/limiter"
	"github.com/openrls/ratelimit/src/reload"
)

// A storm of reloads, a third of them invalid, under concurrent requests:
// no request may ever fail, and every answer comes from a valid config.
func TestReloadStormUnderLoad(t *testing.T) {
	holder := reload.NewHolder(nil)
	build := func(i int) func() (*config.Config, error) {
		return func() (*config.Config, error) {
			src := fmt.Sprintf("domain: web\ndescriptors:\n  - key: ip\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", 1000+i)
			if i%3 == 0 {
				src += "  - key: [broken\n"
			}
			f, err := config.Parse(fmt.Sprintf("v%d.yaml", i), []byte(src))
			if err != nil {
				return nil, err
			}
			return config.Build([]*config.File{f}, config.Options{})
		}
	}
	if err := holder.Install(build(1)); err != nil {
		t.Fatal(err)
	}
	mem := limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: -1})
	defer mem.Close()
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	s, err := New(Options{Store: mem, Configs: holder, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var calls, failures atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := s.ShouldRateLimit(context.Background(), req("web", d(fmt.Sprintf("ip=%d-%d", w, i))))
				calls.Add(1)
				// Config i limits to 1000+i; the invalid ones have i%3 == 0.
				if err != nil || (resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()-1000)%3 == 0 {
					failures.Add(1)
				}
			}
		}()
	}
	var invalid int
	for i := 2; i < 400; i++ {
		if err := holder.Install(build(i)); err != nil {
			invalid++
		}
	}
	close(stop)
	wg.Wait()
	if failures.Load() != 0 {
		t.Errorf("%d of %d requests failed or were answered from an invalid config", failures.Load(), calls.Load())
	}
	ok, failed := holder.Counts()
	if invalid == 0 || failed != uint64(invalid) || ok != uint64(399-invalid) {
		t.Errorf("Counts() = %d ok, %d failed; want %d and %d", ok, failed, 399-invalid, invalid)
	}
	t.Logf("%d requests during 398 reloads (%d invalid)", calls.Load(), invalid)
}
