package integration

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/openrls/ratelimit/src/redis/redistest"
)

// BenchmarkRLQSChurn measures what RLQS bucket churn costs ordinary
// ShouldRateLimit callers: 20 RLQS streams of 500 buckets each, every one
// closed after 0.3 to 1.5 s and opened again with new buckets, for
// -load.duration, beside one caller at 200 calls a second in a process
// and on a connection of its own (each churning client has a connection of
// its own too, as Envoys do). With -rlqs.pin (the default, on a machine
// of two CPUs or more) the service runs on CPU 0 alone (a sidecar with a
// one-CPU limit: Go sizes GOMAXPROCS to it) and this process, its
// churning clients and the caller's process on the others, quiet and
// churning alike, so that what the caller waits for is the service.
// Reported: the caller's p50 and p99 quiet and during the churn, beside
// those of an idle Redis it pings after each call (the machine's floor),
// its failed calls, the service's CPU (cores busy on average) and its CPU
// and allocations per churned bucket, its peak resident memory and the
// RLQS refusals. On the embedded store and on Redis. Loopback only; every
// loop ends with -load.duration.
//
//	go test ./integration-test -run '^$' -bench RLQSChurn -benchtime 1x -args -load.duration=20s [-load.pprof DIR] [-rlqs.pin=false]
func BenchmarkRLQSChurn(b *testing.B) {
	b.Run("memory", func(b *testing.B) { rlqsChurn(b, false) })
	b.Run("redis", func(b *testing.B) { rlqsChurn(b, true) })
}

func rlqsChurn(b *testing.B, redis bool) {
	env := writeConfig(b, map[string]string{"it.yaml": basicConfig, "quota.yaml": `
domain: quota
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100}
`})
	env["LOG_LEVEL"] = "warn"
	if redis {
		srv := redistest.Start(b)
		env["REDIS_URL"], env["BACKEND_TYPE"] = srv.Addr, "redis"
	}
	if *rlqsPin && runtime.NumCPU() >= 2 {
		env[cpusKey] = "0"
		restore := pinSelf(b, fmt.Sprintf("1-%d", runtime.NumCPU()-1))
		defer restore()
	}
	p := start(b, env)
	defer p.stop(b)
	bystander := redistest.Start(b).Addr
	// The caller is a process of its own on a connection of its own, as
	// an Envoy is: what it sees is the service's doing, not this process's
	// churning clients'.
	ordinary := func(d time.Duration) callerResult {
		return callFromProcess(b, callerJob{Addr: p.grpcAddr, Domain: "it", Entry: "user=ordinary", Bystander: bystander, Every: 5 * time.Millisecond, Duration: d})
	}
	q := ordinary(*loadDuration / 2)
	quiet, quietFailed := q.Latencies, q.Failed

	stop := make(chan struct{})
	var streams, buckets atomic.Int64
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			// Each churning client is an Envoy of its own: a connection
			// of its own.
			conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Error(err)
				return
			}
			defer conn.Close()
			for gen := 0; ; gen++ {
				select {
				case <-stop:
					return
				default:
				}
				churnStream(conn, i, gen, rng, stop)
				streams.Add(1)
				buckets.Add(500)
			}
		}()
	}
	// -load.pprof DIR keeps the service's CPU profile of the churn and its
	// heap at the churn's end.
	name := "rlqs-churn-" + map[bool]string{true: "redis", false: "memory"}[redis]
	profiled := saveProfile(b, p.debugAddr, name, *loadDuration)
	before, cpuBefore := metricsBody(b, p), processCPU(p.cmd.Process.Pid)
	bucketsBefore := buckets.Load()
	c := ordinary(*loadDuration)
	cpu := processCPU(p.cmd.Process.Pid) - cpuBefore
	churned := buckets.Load() - bucketsBefore
	during, failed := c.Latencies, c.Failed
	// The handler's own time (the service's histogram, whose only
	// ShouldRateLimit caller is this one) against the caller's: what the
	// caller sees past it is waiting for a processor, in the service or in
	// this process, which the churning clients share.
	handlerP99 := bucketQuantile(before, metricsBody(b, p), "ratelimit_request_duration_seconds", 0.99)
	profiled()
	saveHeap(b, p.debugAddr, name)
	close(stop)
	wg.Wait()
	m := metricsBody(b, p)
	b.ReportMetric(float64(quantile(quiet, 0.99).Microseconds())/1000, "quiet-p99-ms")
	b.ReportMetric(float64(quantile(during, 0.99).Microseconds())/1000, "churn-p99-ms")
	b.ReportMetric(handlerP99*1000, "churn-handler-p99-ms-at-most")
	b.ReportMetric(float64(quantile(c.Bystander, 0.99).Microseconds())/1000, "churn-bystander-p99-ms")
	b.ReportMetric(float64(failed), "churn-failed")
	b.ReportMetric(cpu.Seconds()/loadDuration.Seconds(), "churn-service-cores")
	b.ReportMetric(float64(memKB(b, p, "VmHWM"))/1024, "peak-RSS-MiB")
	if churned > 0 {
		b.ReportMetric(float64(cpu.Microseconds())/float64(churned), "service-CPU-us/churned-bucket")
		allocs := metricValue(m, "go_memstats_mallocs_total") - metricValue(before, "go_memstats_mallocs_total")
		b.ReportMetric(allocs/float64(churned), "service-allocs/churned-bucket-at-most")
	}
	b.Logf("ordinary p50/p99: quiet %v/%v (%d calls, %d failed); churn %v/%v (%d calls, %d failed); an idle Redis beside, pinged by the caller: quiet %v/%v, churn %v/%v; %d streams and %d buckets opened; refused %v",
		quantile(quiet, 0.5), quantile(quiet, 0.99), len(quiet), quietFailed, quantile(during, 0.5), quantile(during, 0.99), len(during), failed,
		quantile(q.Bystander, 0.5), quantile(q.Bystander, 0.99), quantile(c.Bystander, 0.5), quantile(c.Bystander, 0.99),
		streams.Load(), buckets.Load(), fmt.Sprint(metricValue(m, `ratelimit_rlqs_refused_total{what="buckets"}`)))
}

// bucketQuantile is the upper bound of the histogram bucket that holds
// quantile q of the observations made between two scrapes of series.
func bucketQuantile(before, after, series string, q float64) float64 {
	count := metricValue(after, series+"_count") - metricValue(before, series+"_count")
	for _, l := range strings.Split(after, "\n") {
		rest, ok := strings.CutPrefix(l, series+`_bucket{le="`)
		if !ok {
			continue
		}
		le, _, _ := strings.Cut(rest, `"`)
		name := series + `_bucket{le="` + le + `"}`
		if metricValue(after, name)-metricValue(before, name) >= q*count {
			bound, _ := strconv.ParseFloat(le, 64)
			return bound
		}
	}
	return math.Inf(1)
}

// churnStream opens one RLQS stream, reports 500 buckets of its own on
// it, reads what comes for 0.3 to 1.5 s and closes it.
func churnStream(conn *grpc.ClientConn, i, gen int, rng *rand.Rand, stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		return
	}
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "quota"}
	for j := range 500 {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: map[string]string{"tenant": fmt.Sprintf("s%d-g%d-b%d", i, gen, j)}},
			TimeElapsed:        durationpb.New(0),
			NumRequestsAllowed: 1,
		})
	}
	if st.Send(m) != nil {
		return
	}
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
		}
	}()
	select {
	case <-time.After(time.Duration(300+rng.IntN(1200)) * time.Millisecond):
	case <-stop:
	}
}
