package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/openrls/ratelimit/src/config/configtest"
)

// rlqsEachTenant limits every tenant on its own: each bucket its own
// pool, the costliest bucket there is.
const rlqsEachTenant = `
domain: quota
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000}
`

// rlqsFill opens a stream and reports n buckets whose ids idOf makes, in
// messages of at most 200 KB, then reads what comes back until the
// service has answered every bucket it took (or 30 s): it returns the
// largest message it received.
func rlqsFill(t *testing.T, conn *grpc.ClientConn, n int, idOf func(i int) map[string]string) (largest int, err error) {
	// A deadline far past what a fill takes: a stream the service stopped
	// reading without telling the client fails the test, not hangs it.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		return 0, err
	}
	msg, size := &rlqsv3.RateLimitQuotaUsageReports{Domain: "quota"}, 0
	flush := func() error {
		if len(msg.BucketQuotaUsages) == 0 {
			return nil
		}
		err := st.Send(msg)
		msg, size = &rlqsv3.RateLimitQuotaUsageReports{Domain: "quota"}, 0
		if err != nil { // the stream ended: its status says why
			_, err = st.Recv()
		}
		return err
	}
	for i := range n {
		u := &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: idOf(i)}, NumRequestsAllowed: 1}
		msg.BucketQuotaUsages = append(msg.BucketQuotaUsages, u)
		if size += proto.Size(u) + 4; size > 200<<10 {
			if err := flush(); err != nil {
				return 0, err
			}
		}
	}
	if err := flush(); err != nil {
		return 0, err
	}
	got := make(chan int)
	go func() {
		for {
			resp, err := st.Recv()
			if err != nil {
				close(got)
				return
			}
			got <- proto.Size(resp)
		}
	}()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case size, ok := <-got:
			if !ok {
				return largest, nil
			}
			largest = max(largest, size)
		case <-timeout:
			return largest, nil
		}
	}
}

// TestRLQSMemoryIsBoundedByBytes, through the binary: buckets with ids
// at the largest allowed (4 KiB), over nine streams, are taken until a
// stream's ids reach RLQS_MAX_BUCKET_ID_BYTES_PER_STREAM and all streams'
// RLQS_MAX_BUCKET_ID_BYTES, then refused and counted; the resident memory
// they add stays under what docs/settings.md states for the defaults; a
// push of them comes in messages a client limited to 4 MiB reads; and RLS
// calls beside it are answered. Before, one stream of 5,000 buckets of
// 32 KiB ids took 1.5 GB, in one push of 36.5 MB.
func TestRLQSMemoryIsBoundedByBytes(t *testing.T) {
	if raceBuild {
		// Its clients, race-instrumented, push 6 MB each on nine streams
		// while make check's other packages take the two cores: their
		// messages then take past 30 s to arrive, and the listener's guard
		// rightly refuses them as stalled bodies (docs/operations.md).
		// make test runs it, two CPU-bound processes beside it included.
		t.Skip("a load test of the built binary: make test runs it; under the race detector its clients stall past the guard's 30 s")
	}
	p := start(t, writeConfig(t, map[string]string{"quota.yaml": rlqsEachTenant, "it.yaml": basicConfig}))
	p.should(t, "it", configtest.Desc("user=warm"))
	base := memKB(t, p, "VmHWM")
	pad := strings.Repeat("x", 1000)
	idOf := func(stream int) func(i int) map[string]string {
		return func(i int) map[string]string {
			return map[string]string{"tenant": fmt.Sprintf("s%d-%d-%s", stream, i, pad)[:1000], "k1": pad, "k2": pad, "k3": pad}
		}
	}
	// A client that takes no message past 4 MiB, as grpc-java's and
	// grpc-go's default.
	small, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(4<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	var wg sync.WaitGroup
	var mu sync.Mutex
	largest := 0
	// One stream alone first, past its own bound; then eight at once,
	// which pass all streams' together.
	first, err := rlqsFill(t, small, 1500, idOf(0))
	if err != nil {
		t.Fatal(err)
	}
	largest = first
	for s := 1; s < 9; s++ {
		wg.Go(func() {
			n, err := rlqsFill(t, small, 1500, idOf(s))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("stream %d: %v", s, err)
			}
			largest = max(largest, n)
		})
	}
	wg.Wait()
	peak := memKB(t, p, "VmHWM")
	m := metricsBody(t, p)
	t.Logf("9 streams × 1,500 buckets of 4,012-byte ids: peak RSS %d → %d MB, largest push %d KB; refused:\n%s\nthe listener's guard:\n%s",
		base>>10, peak>>10, largest>>10, grepLines(m, "ratelimit_rlqs_refused_total"), grepLines(m, "ratelimit_grpc_guard_total{"))
	for _, what := range []string{"bucket_id_bytes", "total_bucket_id_bytes"} {
		if metricValue(m, `ratelimit_rlqs_refused_total{what="`+what+`"}`) < 1 {
			t.Errorf("no bucket refused for %s", what)
		}
	}
	if largest > 4<<20 || largest == 0 {
		t.Errorf("largest push %d bytes, want some, each under 4 MiB", largest)
	}
	// docs/settings.md: the ids' bound holds their buckets under 400 MB.
	if grew := (peak - base) >> 10; grew > 400 {
		t.Errorf("peak RSS grew %d MB with the ids' bytes bound full, want under 400 MB (docs/settings.md)", grew)
	}
	if got := p.should(t, "it", configtest.Desc("user=beside")).GetOverallCode().String(); got != "OK" {
		t.Errorf("an RLS call beside it: %s", got)
	}
}

// TestRLQSBucketCountMemory, through the binary: 20,000 buckets of short
// ids (RLQS_MAX_BUCKETS=20000 over two streams, 10,000 each at once), each
// its own pool, add at most the resident memory docs/settings.md states
// per bucket (about 14 KB; held here to 16 KB, a busy machine's garbage
// collector lagging more).
func TestRLQSBucketCountMemory(t *testing.T) {
	env := writeConfig(t, map[string]string{"quota.yaml": rlqsEachTenant})
	env["RLQS_MAX_BUCKETS"] = "20000"
	p := start(t, env)
	base := memKB(t, p, "VmHWM")
	var wg sync.WaitGroup
	for s := range 2 {
		wg.Go(func() {
			if _, err := rlqsFill(t, p.conn, 10000, func(i int) map[string]string {
				return map[string]string{"tenant": fmt.Sprintf("s%d-%d", s, i)}
			}); err != nil {
				t.Errorf("stream %d: %v", s, err)
			}
		})
	}
	wg.Wait()
	peak := memKB(t, p, "VmHWM")
	perBucket := float64(peak-base) * 1024 / 20000
	t.Logf("20,000 buckets of short ids: peak RSS %d → %d MB, %.1f KB a bucket; guard:\n%s", base>>10, peak>>10, perBucket/1024,
		grepLines(metricsBody(t, p), "ratelimit_grpc_guard_total"))
	if perBucket > 16<<10 {
		t.Errorf("%.1f KB of resident memory a bucket, want at most 16 KB (docs/settings.md)", perBucket/1024)
	}
}

// TestRLQSReportFloodIsPaced, through the binary: 10 clients, each
// reporting 100 buckets every millisecond for 5 s on a stream (Envoy
// reports once a second at the shortest), reopened when the service ends
// it: a stream's reports are taken in at its pace, the rest held and
// merged by bucket, and a stream past 20,000 bucket usages in a second
// (twice RLQS_MAX_BUCKETS_PER_STREAM) is ended (ResourceExhausted), its
// address's new streams refused for 10 s, before any report is decoded. The service's CPU for it is held under a second a
// second, and an RLS caller beside it is answered every call (its latency
// logged, for the note). Before, the same flood took 14.4 s of CPU in 15 s
// and an ordinary call's p99 from 0.9 to 41 ms.
func TestRLQSReportFloodIsPaced(t *testing.T) {
	p := start(t, writeConfig(t, map[string]string{"quota.yaml": rlqsEachTenant, "it.yaml": basicConfig}))
	p.should(t, "it", configtest.Desc("user=warm"))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	before := processCPU(p.cmd.Process.Pid)
	began := time.Now()
	end := began.Add(5 * time.Second)
	var sent, ended, most atomic.Int64
	var fast atomic.Bool // some stream sent more than 300 reports in a second
	for s := range 10 {
		wg.Go(func() {
			msg := &rlqsv3.RateLimitQuotaUsageReports{Domain: "quota"}
			for i := range 100 {
				msg.BucketQuotaUsages = append(msg.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
					BucketId:           &rlqsv3.BucketId{Bucket: map[string]string{"tenant": fmt.Sprintf("s%d-%d", s, i)}},
					NumRequestsAllowed: 1, TimeElapsed: durationpb.New(time.Millisecond)})
			}
			tick := time.NewTicker(floodEvery)
			defer tick.Stop()
			var mine atomic.Int64
			for streams := 0; streams < 100 && time.Now().Before(end); streams++ {
				if floodStream(t, p, msg, tick, end, &mine, &fast) {
					ended.Add(1)
				}
			}
			sent.Add(mine.Load())
			for {
				if m := most.Load(); mine.Load() <= m || most.CompareAndSwap(m, mine.Load()) {
					break
				}
			}
		})
	}
	var during caller
	wg.Go(func() { during.run(t, p, 100000, stop) })
	time.Sleep(time.Until(end))
	close(stop)
	wg.Wait()
	used := processCPU(p.cmd.Process.Pid) - before
	took := time.Since(began)
	m := metricsBody(t, p)
	held := metricValue(m, `ratelimit_rlqs_report_anomalies_total{kind="report_held"}`)
	refused := metricValue(m, `ratelimit_rlqs_refused_total{what="report_rate"}`)
	t.Logf("%d reports sent in %v, %v held, %v streams ended (%d seen); the service's CPU %v; an RLS caller beside it: %d calls, %d failed, slowest %v",
		sent.Load(), took, held, refused, ended.Load(), used, during.ok.Load(), during.failed.Load(), time.Duration(during.worst.Load()))
	// The pace takes a stream's first 100 reports and 20 a second: a
	// client that sent no more than that in the 5 s (the race detector
	// beside other packages slows a client to a few dozen a second) had
	// nothing held.
	if most.Load() > 100+20*5 && held < 1 {
		t.Errorf("no report held past the pace, though a client sent %d reports in 5 s", most.Load())
	}
	// A client slowed down (the race detector: a few hundred reports a
	// second in all) may never pass the bound; one that sent more than
	// 300 reports of 100 buckets on a stream in a second did, whatever
	// the split of the seconds between its clock and the service's.
	if fast.Load() && ended.Load() < 1 {
		t.Error("a stream reported past 20,000 bucket usages in a second and was not ended")
	}
	if during.failed.Load() > 0 {
		t.Errorf("%d RLS calls failed beside the flood", during.failed.Load())
	}
	if used > took {
		t.Errorf("the service used %v of CPU in %v of flood: want under a second a second", used, took)
	}
}

// floodStream opens a stream and sends msg on it at every tick until end
// or until the service ends it; it reports whether the service ended it
// with ResourceExhausted.
func floodStream(t *testing.T, p *proc, msg *rlqsv3.RateLimitQuotaUsageReports, tick *time.Ticker, end time.Time, sent *atomic.Int64,
	fast *atomic.Bool) bool {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(p.conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		return grpcstatus.Code(err) == codes.ResourceExhausted
	}
	status := make(chan error, 1)
	go func() { // assignments come; read and drop them
		for {
			if _, err := st.Recv(); err != nil {
				status <- err
				return
			}
		}
	}()
	var second int64
	inSecond := 0
	for n := 0; n < 10000 && time.Now().Before(end); n++ {
		<-tick.C
		if err := st.Send(msg); err != nil {
			return grpcstatus.Code(<-status) == codes.ResourceExhausted
		}
		sent.Add(1)
		if s := time.Now().Unix(); s != second {
			second, inSecond = s, 0
		}
		if inSecond++; inSecond > 300 {
			fast.Store(true)
		}
		select {
		case err := <-status:
			return grpcstatus.Code(err) == codes.ResourceExhausted
		default:
		}
	}
	return false
}

// floodEvery is how often each flooding client reports.
const floodEvery = time.Millisecond
