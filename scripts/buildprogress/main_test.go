package main

import (
	"bufio"
	"io"
	"strings"
	"testing"
	"time"
)

// TestReport: packages are counted, a line every `every`; other lines pass
// at once; a silent input gets a line saying the build still runs.
func TestReport(t *testing.T) {
	in := "go: downloading example.com/m v1.0.0\na\nb\nc\n./x.go:1:1: syntax error\nd\n"
	var out strings.Builder
	report(strings.NewReader(in), &out, time.Hour, 2, "compiling")
	want := "go: downloading example.com/m v1.0.0\n  2 packages compiled\n./x.go:1:1: syntax error\n  4 packages compiled\n"
	if out.String() != want {
		t.Errorf("report =\n%q\nwant\n%q", out.String(), want)
	}

	// A silence: the line comes from report's own timer; the test reads
	// report's output until it arrives, however long the machine takes.
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	go func() {
		report(inR, outW, time.Millisecond, 10, "compiling")
		outW.Close()
	}()
	go func() { _, _ = io.WriteString(inW, "a\n") }()
	sc := bufio.NewScanner(outR)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "still compiling (1 packages so far, the last a;") {
			inW.Close()
			_, _ = io.Copy(io.Discard, outR)
			return
		}
	}
	t.Error("report ended without a still-compiling line")
}
