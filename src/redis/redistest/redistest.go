// Package redistest starts real redis-server processes for tests, on free
// loopback ports, and stops them when the test ends: a single node, a
// 3-master Redis Cluster, or a master with a replica and three Sentinels.
package redistest

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Server is one running redis-server (or sentinel).
type Server struct {
	Addr string
	Port int
	// TLS, when set, is how Do connects (StartTLS).
	TLS  *tls.Config
	cmd  *exec.Cmd
	dir  string
	args []string
	tb   testing.TB
	mu   sync.Mutex
	done chan struct{}
}

func binary(tb testing.TB, name string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		tb.Fatalf("%s not found on PATH: the tests need a real Redis; install the Debian package redis-server (apt-get install redis-server)", name)
	}
	return p
}

// portPair finds a loopback port p such that p and p+10000 (the cluster bus)
// are both free. p is drawn from 20000-22767, so buses fall in 30000-32767:
// the two ranges never overlap each other or the kernel's ephemeral ports
// (32768 and up), where the other tests' listeners and every outgoing
// connection live. A stopped node's ports then stay free for its Restart
// unless another redistest server draws the very same port.
func portPair(tb testing.TB) int {
	tb.Helper()
	for range 200 {
		p := 20000 + rand.IntN(2768)
		l1, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		l1.Close()
		if err != nil {
			continue
		}
		l2.Close()
		return p
	}
	tb.Fatal("no free loopback port pair found")
	return 0
}

// Start runs a single redis-server with the given extra arguments (for
// example "--requirepass", "secret").
func Start(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	return start(tb, "redis-server", nil, extra...)
}

// StartTLS runs a redis-server that only speaks TLS, with the given server
// certificate files and the CA its clients must present certificates from
// ("--tls-auth-clients" decides whether they must: pass it in extra).
// client is the config Do uses to reach it.
func StartTLS(tb testing.TB, certFile, keyFile, caFile string, client *tls.Config, extra ...string) *Server {
	tb.Helper()
	return startWith(tb, "redis-server", nil, client, append([]string{"--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--tls-ca-cert-file", caFile}, extra...)...)
}

func start(tb testing.TB, bin string, conf []string, extra ...string) *Server {
	tb.Helper()
	return startWith(tb, bin, conf, nil, extra...)
}

func startWith(tb testing.TB, bin string, conf []string, client *tls.Config, extra ...string) *Server {
	tb.Helper()
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		s := &Server{tb: tb, dir: tb.TempDir(), TLS: client}
		s.Port = portPair(tb)
		s.Addr = "127.0.0.1:" + strconv.Itoa(s.Port)
		portFlag := "--port"
		if client != nil {
			portFlag = "--tls-port"
		}
		args := []string{"--bind", "127.0.0.1", portFlag, strconv.Itoa(s.Port), "--save", "", "--appendonly", "no", "--dir", s.dir}
		if client != nil {
			args = append(args, "--port", "0")
		}
		if conf != nil {
			path := filepath.Join(s.dir, "sentinel.conf")
			body := strings.ReplaceAll(strings.Join(conf, "\n"), "$PORT", strconv.Itoa(s.Port)) + "\n"
			if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
				tb.Fatal(err)
			}
			args = []string{path, "--sentinel"}
		}
		s.args = append(args, extra...)
		if lastErr = s.launch(bin); lastErr == nil {
			tb.Cleanup(s.Stop)
			return s
		}
	}
	tb.Fatalf("start %s: %v", bin, lastErr)
	return nil
}

func (s *Server) launch(bin string) error {
	cmd := exec.Command(binary(s.tb, bin), s.args...)
	logf, err := os.Create(filepath.Join(s.dir, fmt.Sprintf("redis-%d.log", time.Now().UnixNano())))
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			log, _ := os.ReadFile(logf.Name())
			return fmt.Errorf("redis exited at start-up:\n%s", log)
		default:
		}
		// Any RESP answer means the server is up, NOAUTH included.
		if _, err := s.Do("PING"); err == nil || strings.HasPrefix(err.Error(), "redis: ") {
			return nil
		}
		time.Sleep(10 * time.Millisecond) // readiness polling
	}
	s.Stop()
	return fmt.Errorf("redis on %s not answering PING within 10s", s.Addr)
}

// Stop kills the server and waits for it. It is safe to call twice.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Restart starts the server again on the same port (empty: no persistence).
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	if err := s.launch("redis-server"); err != nil {
		s.tb.Fatal(err)
	}
}

// Pause stops the process with SIGSTOP; Resume continues it.
// Pid is the redis-server process's id (for benchmarks that pin it to a
// CPU).
func (s *Server) Pid() int { return s.cmd.Process.Pid }

func (s *Server) Pause()  { _ = s.cmd.Process.Signal(syscall.SIGSTOP) }
func (s *Server) Resume() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }

// Do sends one command with redis-cli-free plain RESP and returns the reply
// rendered as text (arrays joined by newlines). It is for test set-up and
// inspection, not speed.
func (s *Server) Do(args ...string) (string, error) {
	return do(s.Addr, s.TLS, args...)
}

func do(addr string, tlsCfg *tls.Config, args ...string) (string, error) {
	var c net.Conn
	var err error
	if tlsCfg != nil {
		c, err = tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, tlsCfg)
	} else {
		c, err = net.DialTimeout("tcp", addr, time.Second)
	}
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(c))
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("redis: %s", line[1:])
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, _ := strconv.Atoi(line[1:])
		parts := make([]string, 0, max(n, 0))
		for range n {
			p, err := readReply(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

// StartCluster starts masters redis-servers in cluster mode, joins them with
// redis-cli --cluster create, and waits for cluster_state:ok on every node.
func StartCluster(tb testing.TB, masters int) []*Server {
	tb.Helper()
	nodes := make([]*Server, masters)
	addrs := make([]string, masters)
	for i := range nodes {
		nodes[i] = Start(tb, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
		addrs[i] = nodes[i].Addr
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.Command(binary(tb, "redis-cli"), args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, n := range nodes {
		for {
			info, err := n.Do("CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("cluster node %s not ok within 20s: %s %v", n.Addr, info, err)
			}
			time.Sleep(50 * time.Millisecond) // readiness polling
		}
	}
	return nodes
}

// Sentinel is a master, one replica and three sentinels watching them under
// the master name "mymaster".
type Sentinel struct {
	Master, Replica *Server
	Sentinels       []*Server
	MasterName      string
}

// SentinelAddrs returns the sentinels' addresses.
func (s *Sentinel) SentinelAddrs() []string {
	out := make([]string, len(s.Sentinels))
	for i, x := range s.Sentinels {
		out[i] = x.Addr
	}
	return out
}

// StartSentinel starts a monitored master + replica + 3 sentinels and waits
// until the replica is in sync and every sentinel knows it.
func StartSentinel(tb testing.TB) *Sentinel {
	tb.Helper()
	st := &Sentinel{MasterName: "mymaster"}
	// Replicas sync at once (the default waits 5 s for more replicas).
	st.Master = Start(tb, "--repl-diskless-sync-delay", "0")
	st.Replica = Start(tb, "--replicaof", "127.0.0.1", strconv.Itoa(st.Master.Port))
	conf := []string{
		"port $PORT", "bind 127.0.0.1", "dir " + tb.TempDir(),
		"sentinel monitor mymaster 127.0.0.1 " + strconv.Itoa(st.Master.Port) + " 2",
		"sentinel down-after-milliseconds mymaster 1000",
		"sentinel failover-timeout mymaster 3000",
	}
	for range 3 {
		st.Sentinels = append(st.Sentinels, start(tb, "redis-server", conf))
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := st.Master.Do("INFO", "replication")
		if err == nil && strings.Contains(info, "state=online") {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("the replica is not in sync within 30s: %q %v", info, err)
		}
		time.Sleep(20 * time.Millisecond) // readiness polling
	}
	for _, s := range st.Sentinels {
		for {
			reply, err := s.Do("SENTINEL", "REPLICAS", "mymaster")
			if err == nil && strings.Contains(reply, strconv.Itoa(st.Replica.Port)) {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("sentinel %s does not see the replica within 30s: %q %v", s.Addr, reply, err)
			}
			time.Sleep(50 * time.Millisecond) // readiness polling
		}
	}
	return st
}

// CommandStat is one command's line of INFO commandstats.
type CommandStat struct {
	Calls int
	Busy  time.Duration // the time Redis spent running it (usec)
}

// CommandStats reads the server's INFO commandstats, by lower-case command
// name (fcall, evalsha, hincrby, ...).
func (s *Server) CommandStats() (map[string]CommandStat, error) {
	info, err := s.Do("INFO", "commandstats")
	if err != nil {
		return nil, err
	}
	return ParseCommandStats(info), nil
}

// ParseCommandStats reads an INFO commandstats answer, however it was
// asked for (a client authenticated as some user, say).
func ParseCommandStats(info string) map[string]CommandStat {
	out := map[string]CommandStat{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found {
			continue
		}
		var st CommandStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.Atoi(v)
			switch k {
			case "calls":
				st.Calls = n
			case "usec":
				st.Busy = time.Duration(n) * time.Microsecond
			}
		}
		out[name] = st
	}
	return out
}

// ScriptCalls sums stats' calls of Lua code: as a function (FCALL) or a
// script (EVALSHA, EVAL).
func ScriptCalls(stats map[string]CommandStat) (calls int, busy time.Duration) {
	for _, c := range []string{"fcall", "evalsha", "eval"} {
		calls += stats[c].Calls
		busy += stats[c].Busy
	}
	return calls, busy
}

// CanPin reports whether processes can be pinned to CPUs for a benchmark:
// two CPUs or more, and taskset (util-linux) installed.
func CanPin() bool {
	if runtime.NumCPU() < 2 {
		return false
	}
	_, err := exec.LookPath("taskset")
	return err == nil
}

// Pin sets the CPUs every thread of process pid may run on (taskset's
// list form: "0", "1", "0-3"); threads it starts later inherit them.
func Pin(tb testing.TB, pid int, cpus string) {
	tb.Helper()
	if out, err := exec.Command("taskset", "-a", "-p", "-c", cpus, strconv.Itoa(pid)).CombinedOutput(); err != nil {
		tb.Fatalf("taskset -a -p -c %s %d: %v: %s", cpus, pid, err, out)
	}
}

// PinSelf pins this process to CPU 0 until tb ends, when it may run on
// every CPU again.
func PinSelf(tb testing.TB) {
	tb.Helper()
	Pin(tb, os.Getpid(), "0")
	tb.Cleanup(func() { Pin(tb, os.Getpid(), fmt.Sprintf("0-%d", runtime.NumCPU()-1)) })
}
