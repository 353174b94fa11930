// Package memcachedtest starts real memcached processes for tests, on free
// loopback ports, and stops them when the test ends.
package memcachedtest

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Server is one running memcached.
type Server struct {
	Addr string
	// TLS, when set, is how Do connects (StartTLS).
	TLS  *tls.Config
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs a memcached on a free loopback port (64 MB, no UDP) with the
// extra arguments given, and stops it when the test ends.
func Start(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	return start(tb, nil, extra...)
}

// StartTLS runs a memcached that speaks only TLS, with the given server
// certificate files; with caFile set it requires client certificates from
// that CA. client is the config Do uses to reach it.
func StartTLS(tb testing.TB, certFile, keyFile, caFile string, client *tls.Config) *Server {
	tb.Helper()
	opts := "ssl_chain_cert=" + certFile + ",ssl_key=" + keyFile
	if caFile != "" {
		opts += ",ssl_ca_cert=" + caFile + ",ssl_verify_mode=2"
	}
	return start(tb, client, "-Z", "-o", opts)
}

func start(tb testing.TB, client *tls.Config, extra ...string) *Server {
	tb.Helper()
	bin, err := exec.LookPath("memcached")
	if err != nil {
		tb.Fatal("memcached not found on PATH: the tests need a real memcached; install the Debian package memcached (apt-get install memcached)")
	}
	var lastErr error
	for range 5 {
		// 23000-24999: apart from redistest's ports and the kernel's
		// ephemeral range.
		port := 23000 + rand.IntN(2000)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		l.Close()
		args := []string{"-l", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "0", "-m", "64"}
		if os.Geteuid() == 0 {
			args = append(args, "-u", "root") // memcached refuses root without it
		}
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), TLS: client}
		if lastErr = s.launch(tb, bin, append(args, extra...)); lastErr == nil {
			tb.Cleanup(s.Stop)
			return s
		}
	}
	tb.Fatalf("start memcached: %v", lastErr)
	return nil
}

func (s *Server) launch(tb testing.TB, bin string, args []string) error {
	logPath := filepath.Join(tb.TempDir(), "memcached.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(s.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("memcached exited at start-up:\n%s", log)
		default:
		}
		if s.Do("version") == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond) // readiness polling
	}
	s.Stop()
	return fmt.Errorf("memcached on %s not answering within 30s", s.Addr)
}

// Do sends one text-protocol command line and checks that an answer line
// comes back.
func (s *Server) Do(line string) error {
	var c net.Conn
	var err error
	if s.TLS != nil {
		c, err = tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", s.Addr, s.TLS)
	} else {
		c, err = net.DialTimeout("tcp", s.Addr, time.Second)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "%s\r\n", line); err != nil {
		return err
	}
	_, err = bufio.NewReader(c).ReadString('\n')
	return err
}

// Stop kills the server and waits for it. It is safe to call twice.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
}
