// Package docs holds the project's documentation; its test keeps measured
// figures in the documents alone.
package docs

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// measured matches a figure a comment would copy from a measurement: a
// time per operation or a rate, or a number after "measured".
var measured = regexp.MustCompile(`(^|[^\^\d])\d[\d,.]*\s*(µs|ns/op|req/s|decisions/s)\b|(?i)measured[^.]*\d`)

// TestFiguresLiveInTheDocs: comments in the code point to the benchmark or
// document that measured something instead of copying its figures, which
// drift as the code changes while the documents are re-measured.
func TestFiguresLiveInTheDocs(t *testing.T) {
	for _, root := range []string{"../src", "../cmd", "../scripts"} {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
			if err != nil {
				return err
			}
			for _, g := range f.Comments {
				for _, c := range g.List {
					if m := measured.FindString(c.Text); m != "" {
						t.Errorf("%s: %q copies a measured figure; point to docs/performance.md (or the benchmark) instead",
							fset.Position(c.Pos()), strings.TrimSpace(m))
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
