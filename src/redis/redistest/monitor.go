package redistest

import (
	"bufio"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// Monitor is a MONITOR connection to a server: every command the server
// runs, scripts' own redis.call included, as one line each.
type Monitor struct {
	mu    sync.Mutex
	lines []string
}

// Monitor starts watching s until the test ends.
func (s *Server) Monitor(tb testing.TB) *Monitor {
	tb.Helper()
	c, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("*1\r\n$7\r\nMONITOR\r\n")); err != nil {
		tb.Fatal(err)
	}
	r := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
		tb.Fatalf("MONITOR: %q, %v", line, err)
	}
	_ = c.SetReadDeadline(time.Time{})
	m := &Monitor{}
	go func() {
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			m.mu.Lock()
			m.lines = append(m.lines, strings.TrimRight(line, "\r\n"))
			m.mu.Unlock()
		}
	}()
	return m
}

// Lines returns the lines seen so far.
func (m *Monitor) Lines() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.lines...)
}

// Command is one monitored line: who ran it ("lua" for a script's own
// calls, else the client's address) and its arguments, unquoted.
type Command struct {
	Source string
	Args   []string
}

// ParseMonitorLine reads a line such as
// `1700000000.000001 [0 127.0.0.1:5000] "GET" "k"`.
func ParseMonitorLine(line string) (Command, bool) {
	open, end := strings.IndexByte(line, '['), strings.IndexByte(line, ']')
	if open < 0 || end < open {
		return Command{}, false
	}
	var cmd Command
	if _, src, ok := strings.Cut(line[open+1:end], " "); ok {
		cmd.Source = src
	}
	rest := line[end+1:]
	for {
		i := strings.IndexByte(rest, '"')
		if i < 0 {
			return cmd, len(cmd.Args) > 0
		}
		arg, n, ok := unquote(rest[i+1:])
		if !ok {
			return Command{}, false
		}
		cmd.Args = append(cmd.Args, arg)
		rest = rest[i+1+n:]
	}
}

// unquote reads a MONITOR argument after its opening quote (Redis's
// sdscatrepr escapes) and returns it and the bytes consumed.
func unquote(s string) (string, int, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"':
			return b.String(), i + 1, true
		case c == '\\' && i+1 < len(s):
			i++
			switch e := s[i]; e {
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'a':
				b.WriteByte('\a')
			case 'b':
				b.WriteByte('\b')
			case 'x':
				if i+2 >= len(s) {
					return "", 0, false
				}
				var v byte
				for _, h := range s[i+1 : i+3] {
					v = v<<4 | hexVal(byte(h))
				}
				b.WriteByte(v)
				i += 2
			default:
				b.WriteByte(e)
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", 0, false
}

func hexVal(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10
	}
	return 0
}
