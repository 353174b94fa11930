package main

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestReport(t *testing.T) {
	tests := []struct {
		name     string
		events   string
		wantCode int
		want     []string // each must appear, in order
		notWant  []string
	}{
		{"all pass", `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"noise\n"}
{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0.1}
{"Action":"pass","Package":"p","Elapsed":1.25}
`, 0, []string{"ok  \tp\t1.2s", "packages: 1 passed, 0 failed", "1 passed, 0 failed"}, []string{"noise"}},
		{"a failing test shows its output", `{"Action":"output","Package":"q","Test":"TestB","Output":"    b_test.go:9: got 1, want 2\n"}
{"Action":"fail","Package":"q","Test":"TestB"}
{"Action":"output","Package":"q","Output":"FAIL\n"}
{"Action":"output","Package":"q","Output":"FAIL\tq\t1.987s\n"}
{"Action":"fail","Package":"q","Elapsed":2}
`, 1, []string{"b_test.go:9: got 1, want 2", "FAIL\n", "FAIL\tq\t2.0s", "packages: 0 passed, 1 failed", "0 passed, 1 failed"}, []string{"1.987s"}},
		{"a failed subtest and its parent are one failure", `{"Action":"output","Package":"t","Test":"TestD/sub","Output":"    d_test.go:3: wrong\n"}
{"Action":"fail","Package":"t","Test":"TestD/sub"}
{"Action":"fail","Package":"t","Test":"TestD"}
{"Action":"fail","Package":"t","Test":"TestE"}
{"Action":"fail","Package":"t","Elapsed":1}
`, 1, []string{"d_test.go:3: wrong", "packages: 0 passed, 1 failed", "0 passed, 2 failed"}, nil},
		{"a panic in a test that never ends", `{"Action":"output","Package":"r","Test":"TestC","Output":"panic: boom\n"}
{"Action":"fail","Package":"r","Elapsed":0.5}
`, 1, []string{"panic: boom", "FAIL\tr"}, nil},
		{"build errors pass through", `{"ImportPath":"s","Action":"build-output","Output":"s/x.go:3:1: syntax error\n"}
{"Action":"fail","Package":"s"}
`, 1, []string{"s/x.go:3:1: syntax error", "FAIL\ts"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			code := report(strings.NewReader(tc.events), &out, time.Hour)
			got := out.String()
			if code != tc.wantCode {
				t.Errorf("report() = %d, want %d; output:\n%s", code, tc.wantCode, got)
			}
			rest := got
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("output lacks %q (in order):\n%s", w, got)
				}
				rest = rest[i+len(w):]
			}
			for _, nw := range tc.notWant {
				if strings.Contains(got, nw) {
					t.Errorf("output has %q:\n%s", nw, got)
				}
			}
		})
	}
}

// TestReportSaysWhatStillRuns: when nothing has been written for a while,
// the report says which packages still run, so a long run is never silent.
func TestReportSaysWhatStillRuns(t *testing.T) {
	r, w := io.Pipe()
	var out syncBuffer
	done := make(chan int)
	go func() { done <- report(r, &out, 20*time.Millisecond) }()
	fmt.Fprintln(w, `{"Action":"start","Package":"notests"}`)
	fmt.Fprintln(w, `{"Action":"skip","Package":"notests"}`)
	fmt.Fprintln(w, `{"Action":"start","Package":"slowpkg"}`)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "... still running: slowpkg (") {
		if time.Now().After(deadline) {
			t.Fatalf("no progress line within 10 s: %q", out.String())
		}
		time.Sleep(5 * time.Millisecond) // polling the report's output
	}
	if strings.Contains(out.String(), "notests") {
		t.Errorf("a package without tests is listed as running: %q", out.String())
	}
	fmt.Fprintln(w, `{"Action":"pass","Package":"slowpkg","Elapsed":1}`)
	w.Close()
	if code := <-done; code != 0 {
		t.Errorf("exit %d:\n%s", code, out.String())
	}
}

// syncBuffer is a bytes.Buffer the report and the test may use at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
