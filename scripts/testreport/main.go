// Command testreport turns `go test -json` into progress a person can
// follow: one line per package as it finishes (the packages run in
// parallel, so the order is the order they finish in), the whole output of
// every failed test, build errors as they come, and a closing
// "N passed, N failed" line. It exits 1 if anything failed.
//
//	go test -json ./... | go run ./scripts/testreport
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
)

// event is the part of a test2json event this reads.
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

func main() {
	os.Exit(report(os.Stdin, os.Stdout, 15*time.Second))
}

// report reads events from r and writes progress to w; it returns the exit
// code. When it has written nothing for quiet, it says what still runs (or
// that the tests are still being compiled), so that a cold run is never
// silent for long.
func report(r io.Reader, w io.Writer, quiet time.Duration) int {
	t := &tally{outputs: map[string]*strings.Builder{}, failedIDs: map[string]bool{}, running: map[string]time.Time{}}
	lines := make(chan []byte)
	var scanErr error
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			lines <- slices.Clone(sc.Bytes())
		}
		scanErr = sc.Err()
		close(lines)
	}()
	pw := &progressWriter{w: w, last: time.Now()}
	w = pw
	// Checked every second (or faster for a short quiet): a check every
	// quiet/4 left a cold run silent for 25 s with quiet at 20 s.
	tick := time.NewTicker(max(min(quiet/4, time.Second), time.Millisecond))
	defer tick.Stop()
read:
	for {
		var line []byte
		select {
		case l, ok := <-lines:
			if !ok {
				break read
			}
			line = l
		case now := <-tick.C:
			if now.Sub(pw.last) >= quiet {
				fmt.Fprintln(w, stillRunning(t.running, now))
			}
			continue
		}
		var e event
		if json.Unmarshal(line, &e) != nil {
			fmt.Fprintln(w, string(line)) // not an event: pass it on
			continue
		}
		t.add(e, w)
	}
	fmt.Fprintf(w, "packages: %d passed, %d failed\n", t.passedPkgs, t.failedPkgs)
	fmt.Fprintf(w, "%d passed, %d failed\n", t.passedTests, t.failedTests)
	if t.failedPkgs > 0 || t.failedTests > 0 || scanErr != nil {
		return 1
	}
	return 0
}

// tally is what report has read so far.
type tally struct {
	outputs   map[string]*strings.Builder // package or package/test → output
	failedIDs map[string]bool             // package/test of each failed test
	running   map[string]time.Time        // packages started, not ended → when

	passedPkgs, failedPkgs, passedTests, failedTests int
}

// add takes in one event, writing to w what it shows.
func (t *tally) add(e event, w io.Writer) {
	id := e.Package + "/" + e.Test
	switch e.Action {
	case "start":
		t.running[e.Package] = time.Now()
	case "build-output":
		fmt.Fprint(w, e.Output)
	case "output":
		b := t.outputs[id]
		if b == nil {
			b = &strings.Builder{}
			t.outputs[id] = b
		}
		b.WriteString(e.Output)
	case "pass", "fail", "skip":
		t.ended(e, id, w)
		delete(t.outputs, id)
	}
}

// ended counts a test or package that ended, writing a failed one's
// output and a package's closing line.
func (t *tally) ended(e event, id string, w io.Writer) {
	failed := e.Action == "fail"
	if e.Test == "" {
		delete(t.running, e.Package) // a package without tests ends with skip
	}
	switch {
	case e.Test != "" && failed:
		// A test fails with its failed subtests (which end first):
		// one failure, counted at the deepest test.
		if !hasFailedChild(t.failedIDs, id) {
			t.failedTests++
		}
		t.failedIDs[id] = true
		if b := t.outputs[id]; b != nil {
			fmt.Fprint(w, b.String())
		}
	case e.Test != "" && e.Action == "pass":
		t.passedTests++
	case e.Test == "" && failed:
		t.failedPkgs++
		// The package's own lines and any test it never finished
		// (a panic, a timeout, TestMain).
		for _, o := range unfinished(t.outputs, e.Package) {
			fmt.Fprint(w, o)
		}
		fmt.Fprintf(w, "FAIL\t%s\t%.1fs\n", e.Package, e.Elapsed)
	case e.Test == "" && e.Action == "pass":
		t.passedPkgs++
		fmt.Fprintf(w, "ok  \t%s\t%.1fs\n", e.Package, e.Elapsed)
	}
}

// progressWriter notes when it last wrote.
type progressWriter struct {
	w    io.Writer
	last time.Time
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.last = time.Now()
	return p.w.Write(b)
}

// stillRunning says what the run is waiting for: the packages whose tests
// run, longest first, or the compiler.
func stillRunning(running map[string]time.Time, now time.Time) string {
	if len(running) == 0 {
		return "... compiling the tests (nothing has finished for a while; a cold build cache takes minutes)"
	}
	pkgs := make([]string, 0, len(running))
	for p := range running {
		pkgs = append(pkgs, p)
	}
	sort.Slice(pkgs, func(i, j int) bool { return running[pkgs[i]].Before(running[pkgs[j]]) })
	parts := make([]string, len(pkgs))
	for i, p := range pkgs {
		parts[i] = fmt.Sprintf("%s (%ds)", p, int(now.Sub(running[p]).Seconds()))
	}
	return "... still running: " + strings.Join(parts, ", ")
}

// hasFailedChild reports whether a subtest of id failed.
func hasFailedChild(failed map[string]bool, id string) bool {
	for f := range failed {
		if strings.HasPrefix(f, id+"/") {
			return true
		}
	}
	return false
}

// unfinished removes and returns, sorted by test, the output still held for
// pkg: its own lines and those of tests that never ended.
func unfinished(outputs map[string]*strings.Builder, pkg string) []string {
	var ids []string
	for id := range outputs {
		if strings.HasPrefix(id, pkg+"/") {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	out := make([]string, len(ids))
	for i, id := range ids {
		// go test's own closing line for the package; report writes its own.
		var kept []string
		for _, l := range strings.SplitAfter(outputs[id].String(), "\n") {
			if !strings.HasPrefix(l, "FAIL\t"+pkg+"\t") {
				kept = append(kept, l)
			}
		}
		out[i] = strings.Join(kept, "")
		delete(outputs, id)
	}
	return out
}
