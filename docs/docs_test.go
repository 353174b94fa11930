// Package docs holds the project's documentation; its tests keep measured
// figures in the documents alone and the code's imports to the package map
// in development.md.
package docs

import (
	"go/ast"
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
var measured = regexp.MustCompile(`(^|[^\^\d])\d[\d,.]*\s*(µs|ns/op|req/s|decisions/s)\b|(^|[^\^\d])\d[\d,.]*\s*%|(?i)measured[^.]*\d`)

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

// TestImportsFollowThePackageMap: every package under src/ and cmd/ has a
// row in development.md's import table, and imports nothing of this
// module beyond that row.
func TestImportsFollowThePackageMap(t *testing.T) {
	allowed := importTable(t)
	module := modulePath(t)
	seen := map[string]bool{}
	for _, root := range []string{"../src", "../cmd"} {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			pkg := strings.TrimPrefix(filepath.ToSlash(filepath.Dir(path)), "../")
			seen[pkg] = true
			may, ok := allowed[pkg]
			if !ok {
				return nil // reported once below
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			for _, imp := range f.Imports {
				p := strings.Trim(imp.Path.Value, `"`)
				dep, ours := strings.CutPrefix(p, module+"/src/")
				if !ours {
					continue
				}
				if !may[dep] {
					t.Errorf("%s imports %s, which its row in docs/development.md does not allow", path, dep)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for pkg := range seen {
		if _, ok := allowed[pkg]; !ok {
			t.Errorf("%s has no row in docs/development.md's import table", pkg)
		}
	}
	for pkg := range allowed {
		if !seen[pkg] {
			t.Errorf("docs/development.md's import table names %s, which is not a package", pkg)
		}
	}
}

// importTable reads the rows of "What each package may import": package
// (src/... or cmd/...) → the src/ packages it may import.
func importTable(t *testing.T) map[string]map[string]bool {
	t.Helper()
	data, err := os.ReadFile("development.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "## What each package may import\n")
	if !ok {
		t.Fatal(`docs/development.md has no "What each package may import" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	paren := regexp.MustCompile(`\([^)]*\)`)
	out := map[string]map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 4 || !strings.Contains(cells[1], "`") {
			continue
		}
		may := map[string]bool{}
		if deps := strings.TrimSpace(paren.ReplaceAllString(cells[2], "")); deps != "nothing of this module" {
			for _, d := range strings.Split(deps, ",") {
				may[strings.TrimSpace(d)] = true
			}
		}
		for _, p := range strings.Split(cells[1], ",") {
			out[strings.Trim(strings.TrimSpace(p), "`")] = may
		}
	}
	if len(out) == 0 {
		t.Fatal("docs/development.md's import table has no rows")
	}
	return out
}

func modulePath(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if m, ok := strings.CutPrefix(line, "module "); ok {
			return strings.TrimSpace(m)
		}
	}
	t.Fatal("go.mod names no module")
	return ""
}

// maxFile and maxFunc are the size rule of development.md, in lines.
const maxFile, maxFunc = 450, 60

// TestCodeStaysSmall: no production file of src/ or cmd/ passes 450 lines,
// and no function 60, as development.md asks; a table of step data
// (limitertest's scenarios, a _test.go) is not held to it.
func TestCodeStaysSmall(t *testing.T) {
	for _, root := range []string{"../src", "../cmd"} {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") ||
				strings.Contains(path, "limitertest") {
				return err
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			if n := fset.File(f.Pos()).LineCount(); n > maxFile {
				t.Errorf("%s: %d lines, past %d", path, n, maxFile)
			}
			for _, decl := range f.Decls {
				if fd, ok := decl.(*ast.FuncDecl); ok && fd.Body != nil {
					if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > maxFunc {
						t.Errorf("%s: %s is %d lines, past %d", path, fd.Name.Name, n, maxFunc)
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

// luaFunc is the first line of a top-level Lua function; it ends at the
// next line that is "end" alone, at the start of the line.
var luaFunc = regexp.MustCompile(`^(local )?function ([A-Za-z_][A-Za-z0-9_.:]*)`)

// TestLuaStaysSmall holds the Lua scripts to the same rule as the Go:
// no file past 450 lines, no top-level function past 60.
func TestLuaStaysSmall(t *testing.T) {
	paths, err := filepath.Glob("../src/*/*.lua")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no Lua scripts found (%v)", err)
	}
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		if len(lines) > maxFile {
			t.Errorf("%s: %d lines, past %d", path, len(lines), maxFile)
		}
		name, start := "", 0
		for i, line := range lines {
			if m := luaFunc.FindStringSubmatch(line); m != nil && name == "" {
				name, start = m[2], i
			}
			if line == "end" && name != "" {
				if n := i - start + 1; n > maxFunc {
					t.Errorf("%s: %s is %d lines, past %d", path, name, n, maxFunc)
				}
				name = ""
			}
		}
		if name != "" {
			t.Errorf("%s: %s has no end at the start of a line", path, name)
		}
	}
}
