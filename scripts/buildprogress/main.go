// Command buildprogress turns `go build -v` output into progress a person
// can follow: a line per 10 packages compiled, every other line (module
// downloads, errors) as it comes, and, when nothing was written for a
// while (one large package compiling on a busy machine), a line saying the
// build still runs. It replaces an awk filter: Debian's awk (mawk) held its
// output back, and awk cannot speak when its input is silent.
//
//	go build -v ./... 2>&1 | go run ./scripts/buildprogress
//	go vet ./... 2>&1 | go run ./scripts/buildprogress vetting
//
// The argument, "compiling" by default, names what the silent line says
// still runs.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

func main() {
	doing := "compiling"
	if len(os.Args) > 1 {
		doing = os.Args[1]
	}
	report(os.Stdin, os.Stdout, 15*time.Second, 10, doing)
}

// report copies r's lines to w as described above: package paths are
// counted and reported every `every`, other lines written at once, and
// after quiet without writing, a line that it is still doing so.
func report(r io.Reader, w io.Writer, quiet time.Duration, every int, doing string) {
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	start := time.Now()
	n, last := 0, ""
	tick := time.NewTimer(quiet)
	defer tick.Stop()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return
			}
			if isPackage(l) {
				n, last = n+1, l
				if n%every != 0 {
					continue
				}
				l = fmt.Sprintf("  %d packages compiled", n)
			}
			fmt.Fprintln(w, l)
		case <-tick.C:
			if n == 0 {
				fmt.Fprintf(w, "  still %s (%s)\n", doing, time.Since(start).Round(time.Second))
			} else {
				fmt.Fprintf(w, "  still %s (%d packages so far, the last %s; %s)\n", doing, n, last, time.Since(start).Round(time.Second))
			}
		}
		tick.Reset(quiet)
	}
}

// isPackage reports whether l is a package path as go build -v prints
// them: one word, no colon (errors and "go: downloading" lines have both).
func isPackage(l string) bool {
	return l != "" && !strings.ContainsAny(l, " :\t")
}
