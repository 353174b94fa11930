package settings

import (
	"bufio"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// referenceVariables reads testdata/reference-variables.txt: every variable
// envoyproxy/ratelimit reads, with its default there.
func referenceVariables(t *testing.T) (names []string, defaults map[string]string) {
	t.Helper()
	f, err := os.Open("testdata/reference-variables.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	defaults = map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, def, ok := strings.Cut(line, " ")
		if !ok {
			t.Fatalf("fixture line %q: want NAME DEFAULT", line)
		}
		if _, dup := defaults[name]; dup {
			t.Fatalf("fixture lists %s twice", name)
		}
		names = append(names, name)
		defaults[name] = strings.Trim(def, `"`)
	}
	return names, defaults
}

// migratingRow is one row of docs/migrating.md's table of the reference's
// variables.
type migratingRow struct{ status, refDefault, note string }

func migratingTable(t *testing.T) map[string]migratingRow {
	t.Helper()
	data, err := os.ReadFile("../../docs/migrating.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]migratingRow{}
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 4 {
			t.Fatalf("docs/migrating.md row %q: want 4 cells", line)
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		name := strings.Trim(cells[0], "`")
		if _, dup := rows[name]; dup {
			t.Errorf("docs/migrating.md lists %s twice", name)
		}
		rows[name] = migratingRow{status: cells[2], refDefault: strings.Trim(cells[1], "`"), note: cells[3]}
	}
	return rows
}

// ourDefaults maps every variable the service reads to its envconfig default.
func ourDefaults() map[string]string {
	out := map[string]string{}
	eachVar(func(name string, f reflect.StructField) { out[name] = f.Tag.Get("default") })
	return out
}

func sameDefault(a, b string) bool {
	norm := func(s string) string {
		if s == "0" || strings.EqualFold(s, "false") {
			return ""
		}
		return strings.ToLower(s)
	}
	return norm(a) == norm(b)
}

// TestEveryReferenceVariableAccountedFor: each of the reference's variables
// is in docs/migrating.md's table exactly once, with the reference's default,
// and its status there is what the code does: "same" and "differs" are
// read by the service ("same" with the reference's default, "differs" with
// what differs said), "warned" are not read and are named at start-up.
func TestEveryReferenceVariableAccountedFor(t *testing.T) {
	names, refDefaults := referenceVariables(t)
	rows := migratingTable(t)
	ours := ourDefaults()
	for name := range rows {
		if _, ok := refDefaults[name]; !ok {
			t.Errorf("docs/migrating.md lists %s, which is not a variable of the reference (testdata/reference-variables.txt)", name)
		}
	}
	for _, name := range names {
		row, ok := rows[name]
		if !ok {
			t.Errorf("%s: not in docs/migrating.md's table", name)
			continue
		}
		if ref := refDefaults[name]; ref != "-" && !sameDefault(row.refDefault, ref) {
			t.Errorf("%s: docs/migrating.md says the reference's default is %q, the reference's is %q", name, row.refDefault, ref)
		}
		def, read := ours[name]
		switch row.status {
		case "same":
			if !read {
				t.Errorf("%s: documented as honoured the same, but the service does not read it", name)
			} else if !sameDefault(def, refDefaults[name]) {
				t.Errorf("%s: documented as the same, but the default here is %q, the reference's %q", name, def, refDefaults[name])
			}
		case "differs":
			if !read {
				t.Errorf("%s: documented as honoured, but the service does not read it", name)
			}
			if row.note == "" {
				t.Errorf("%s: documented as differing without saying how", name)
			}
		case "warned":
			if read {
				t.Errorf("%s: documented as warned, but the service reads it", name)
			}
			env := name
			t.Run(name, func(t *testing.T) {
				t.Setenv(env, "1")
				if w := Warnings(); !slices.ContainsFunc(w, func(l string) bool { return strings.HasPrefix(l, env+":") }) {
					t.Errorf("setting %s logs no warning naming it (warnings: %q)", env, w)
				}
			})
		default:
			t.Errorf("%s: status %q, want same, differs or warned", name, row.status)
		}
	}
	// Nothing is warned about that the table does not list.
	for name := range ignored {
		if rows[name].status != "warned" {
			t.Errorf("%s draws a warning but docs/migrating.md does not say warned", name)
		}
	}
}
