package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// deepConfig nests keys k0 … k31 under one another, each level with a
// limit, so that a request's 32-entry descriptors match all the way down.
func deepConfig() string {
	node := ""
	for i := 31; i >= 0; i-- {
		children := ""
		if node != "" {
			children = ", descriptors: [" + node + "]"
		}
		node = fmt.Sprintf("{key: k%d, rate_limit: {unit: hour, requests_per_unit: 1000000}%s}", i, children)
	}
	return "domain: deep\ndescriptors: [" + node + "]\n"
}

// maximalRequest is as large as the default bounds let a request be: 64
// descriptors of 32 entries, about 210 KB in all, every descriptor matching
// a limit 32 levels deep.
func maximalRequest(n int) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: "deep"}
	for d := range 64 {
		desc := &rlv3.RateLimitDescriptor{}
		for e := range 32 {
			desc.Entries = append(desc.Entries, &rlv3.RateLimitDescriptor_Entry{Key: fmt.Sprintf("k%d", e),
				Value: fmt.Sprintf("%03d-%02d-%06d-", d, e, n) + strings.Repeat("v", 84)})
		}
		req.Descriptors = append(req.Descriptors, desc)
	}
	return req
}

// TestMaximalRequestsMemoryBounded: 400 concurrent requests as large as
// the default bounds allow, three times over, are answered (or refused for
// load), and the process's peak resident memory stays bounded: Go's
// memory limit follows the live heap (no container limit here, no
// GOMEMLIMIT), and large requests past GRPC_MAX_REQUEST_BYTES_IN_FLIGHT
// are refused before they are decoded.
func TestMaximalRequestsMemoryBounded(t *testing.T) {
	env := writeConfig(t, map[string]string{"deep.yaml": deepConfig()})
	p := start(t, env)
	before := memKB(t, p, "VmRSS")
	conns := openConns(t, p, 8)
	reqs := make([]*rlsv3.RateLimitRequest, 400)
	for i := range reqs {
		reqs[i] = maximalRequest(i)
	}
	var mu sync.Mutex
	var cutByGuard atomic.Bool
	got := map[codes.Code]int{}
	var wg sync.WaitGroup
	for round := range 3 {
		for i := range reqs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				_, err := rlsv3.NewRateLimitServiceClient(conns[i%len(conns)]).ShouldRateLimit(ctx, reqs[i])
				if status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "ENHANCE_YOUR_CALM") {
					cutByGuard.Store(true)
				}
				mu.Lock()
				if got[status.Code(err)]++; err != nil && got[status.Code(err)] == 1 {
					t.Logf("round %d: first %v: %v", round, status.Code(err), err)
				}
				mu.Unlock()
			}()
		}
		wg.Wait()
	}
	peak := memKB(t, p, "VmHWM")
	t.Logf("3 x 400 concurrent maximal requests: codes %v; RSS %d MiB before, peak %d MiB", got, before>>10, peak>>10)
	// Without a bound (GOGC 400, no memory limit, every request decoded)
	// the peak was about 800 MiB on a quiet machine; with them it is about
	// 275, and 400-505 on one core shared with three CPU burners (the
	// collector, starved, lags, and more requests wait decoded): the bound
	// leaves room for that.
	if peak > 640<<10 {
		t.Errorf("peak resident memory %d MiB, want under 640 MiB", peak>>10)
	}
	if got[codes.OK] == 0 {
		t.Errorf("no maximal request answered: %v", got)
	}
	// Past the budget a request is refused (ResourceExhausted) before it
	// is decoded, or, while its bytes still arrive, its connection is cut
	// (GOAWAY ENHANCE_YOUR_CALM: Unavailable for the calls on it) when the
	// unfinished bodies would pass the budget: 400 maximal requests at
	// once are 84 MB, past the default 64 MiB.
	for c := range got {
		if c != codes.OK && c != codes.ResourceExhausted && !(c == codes.Unavailable && cutByGuard.Load()) {
			t.Errorf("maximal requests answered %v (%d), want OK, ResourceExhausted, or Unavailable from the guard's GOAWAY", c, got[c])
		}
	}
}
