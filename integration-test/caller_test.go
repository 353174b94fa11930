package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/openrls/ratelimit/src/config/configtest"
)

// callerEnv names the variable that turns this test binary into an
// ordinary caller (see callerMain): a benchmark that loads the service
// measures its ordinary callers from a process of their own, as a user's
// Envoys are, so that the load's clients, their garbage collection and
// their scheduling are not counted in the callers' latency.
const callerEnv = "RATELIMIT_IT_CALLER"

// callerJob is what a caller process is asked to do, and callerResult
// what it answers on its standard output.
type callerJob struct {
	Addr     string
	Domain   string
	Entry    string // k=v
	Every    time.Duration
	Duration time.Duration
	// Bystander, when set, is a Redis server beside the service, idle,
	// pinged after each call: how long a process that shares the machine
	// but not the service waits is the floor the machine's load sets under
	// the service's latency.
	Bystander string
}

type callerResult struct {
	Latencies []time.Duration
	Failed    int
	Bystander []time.Duration
}

// callerMain runs the job in callerEnv, if set, and reports whether it did.
func callerMain() bool {
	spec := os.Getenv(callerEnv)
	if spec == "" {
		return false
	}
	var job callerJob
	if err := json.Unmarshal([]byte(spec), &job); err != nil {
		fmt.Fprintln(os.Stderr, "caller:", err)
		os.Exit(1)
	}
	res, err := call(job)
	if err != nil {
		fmt.Fprintln(os.Stderr, "caller:", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		os.Exit(1)
	}
	return true
}

// call makes one ShouldRateLimit call every job.Every for job.Duration on
// a connection of its own, each bounded by 5 s.
func call(job callerJob) (callerResult, error) {
	var res callerResult
	conn, err := grpc.NewClient(job.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return res, err
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: job.Domain, Descriptors: descs(configtest.Desc(job.Entry))}
	var ping func() (time.Duration, error)
	if job.Bystander != "" {
		c, err := net.DialTimeout("tcp", job.Bystander, 5*time.Second)
		if err != nil {
			return res, err
		}
		defer c.Close()
		r := bufio.NewReader(c)
		ping = func() (time.Duration, error) {
			begin := time.Now()
			_ = c.SetDeadline(begin.Add(5 * time.Second))
			if _, err := c.Write([]byte("PING\r\n")); err != nil {
				return 0, err
			}
			if _, err := r.ReadString('\n'); err != nil {
				return 0, err
			}
			return time.Since(begin), nil
		}
	}
	t := time.NewTicker(job.Every)
	defer t.Stop()
	for end := time.Now().Add(job.Duration); time.Now().Before(end); <-t.C {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		begin := time.Now()
		_, err := client.ShouldRateLimit(ctx, req)
		cancel()
		if err != nil {
			res.Failed++
			continue
		}
		res.Latencies = append(res.Latencies, time.Since(begin))
		if ping != nil {
			d, err := ping()
			if err != nil {
				return res, fmt.Errorf("bystander: %w", err)
			}
			res.Bystander = append(res.Bystander, d)
		}
	}
	return res, nil
}

// callFromProcess runs job in a child process (this test binary) and
// returns what it measured.
func callFromProcess(t testing.TB, job callerJob) callerResult {
	t.Helper()
	spec, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), callerEnv+"="+string(spec))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("caller process: %v: %s", err, errOut.String())
	}
	var res callerResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("caller process answered %q: %v", out.String(), err)
	}
	return res
}
