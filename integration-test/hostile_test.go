package integration

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// memKB reads a line such as VmRSS or VmHWM (peak) of the server's
// /proc status, in KiB.
func memKB(t *testing.T, p *proc, field string) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + field + `:\s+(\d+) kB`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("no %s in /proc status", field)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// flood sends n concurrent requests, each with one value of size bytes,
// over conns connections, and returns the error codes seen.
func flood(t *testing.T, p *proc, n, conns, size int) map[codes.Code]int {
	t.Helper()
	cs := make([]*grpc.ClientConn, conns)
	for i := range cs {
		c, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cs[i] = c
	}
	big := strings.Repeat("v", size)
	var mu sync.Mutex
	got := map[codes.Code]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err := rlsv3.NewRateLimitServiceClient(cs[i%conns]).ShouldRateLimit(ctx,
				&rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(desc("user=" + big))})
			mu.Lock()
			got[status.Code(err)]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	return got
}

// TestRequestFloodStaysBounded: 200 concurrent requests of 3 MB each are
// refused from their length prefix (REQUEST_MAX_BYTES) without being
// buffered, small requests keep being served meanwhile, and the peak
// resident memory stays far below what buffering them would take (600 MB).
func TestRequestFloodStaysBounded(t *testing.T) {
	p := start(t, writeConfig(t, map[string]string{"it.yaml": basicConfig}))
	before := memKB(t, p, "VmRSS")

	var served, failed atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // small requests during the flood
		defer close(done)
		for i := 0; i < 100_000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := p.client().ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(desc("user=small" + strconv.Itoa(i)))})
			cancel()
			if err != nil {
				failed.Add(1)
			} else {
				served.Add(1)
			}
		}
	}()
	got := flood(t, p, 200, 4, 3<<20)
	close(stop)
	<-done
	peak := memKB(t, p, "VmHWM")
	t.Logf("3 MB x 200 concurrent: codes %v; RSS %d MiB before, peak %d MiB; %d small requests served, %d failed, meanwhile",
		got, before>>10, peak>>10, served.Load(), failed.Load())
	if got[codes.ResourceExhausted] != 200 {
		t.Errorf("3 MB requests: codes %v, want all 200 ResourceExhausted", got)
	}
	if served.Load() == 0 || failed.Load() > 0 {
		t.Errorf("small requests during the flood: %d served, %d failed; want all served", served.Load(), failed.Load())
	}
	if peak > 256<<10 {
		t.Errorf("peak resident memory %d MiB during the flood, want under 256 MiB", peak>>10)
	}

	// Just under the bound: accepted and counted, memory bounded by the
	// concurrency times the bound.
	got = flood(t, p, 200, 4, 200<<10)
	peak = memKB(t, p, "VmHWM")
	t.Logf("200 KB x 200 concurrent: codes %v; peak RSS %d MiB", got, peak>>10)
	if got[codes.OK] != 200 {
		t.Errorf("200 KB requests: codes %v, want all OK", got)
	}
	if peak > 384<<10 {
		t.Errorf("peak resident memory %d MiB, want under 384 MiB", peak>>10)
	}
	if _, err := p.client().ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "it", Descriptors: descs(desc("user=after"))}); err != nil {
		t.Errorf("a small request after the floods: %v", err)
	}

	// Memory comes back once the process is quiet (src/memtrim looks every
	// 5 s); without it the high GOGC kept the spike resident for minutes.
	deadline := time.Now().Add(40 * time.Second)
	rss := memKB(t, p, "VmRSS")
	for rss > before+24<<10 && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond) // polling the process's own trimming
		rss = memKB(t, p, "VmRSS")
	}
	t.Logf("after the floods: RSS %d MiB (%d MiB before them)", rss>>10, before>>10)
	if rss > before+24<<10 {
		t.Errorf("RSS %d MiB 40 s after the floods, want back within 24 MiB of the %d MiB before them", rss>>10, before>>10)
	}
}
