package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestClientAnswersAsTheREADMEShows: bin/client, built as make builds it,
// against the binary on the example config prints what the README shows
// for its calls (the moving reset aside), and says why an answer had no
// limit (an unlimited rule, an unknown domain), as its debug port's
// /explain tells it.
func TestClientAnswersAsTheREADMEShows(t *testing.T) {
	client := filepath.Join(t.TempDir(), "client")
	if out, err := exec.Command("go", "build", "-o", client, "../cmd/client").CombinedOutput(); err != nil {
		t.Fatalf("build client: %v\n%s", err, out)
	}
	example, err := os.ReadFile("../examples/ratelimit-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, writeConfig(t, map[string]string{"ratelimit-config.yaml": string(example)}))
	run := func(args ...string) string {
		out, _ := exec.Command(client, append([]string{"-addr", p.grpcAddr, "-debug_addr", p.debugAddr}, args...)...).CombinedOutput()
		return string(out)
	}
	// The README's unlimited call and its answer, as written there.
	m := regexp.MustCompile(`(?m)^bin/client (-domain example -descriptors remote_address=127\.0\.0\.1)\n((?:# .*\n)+)`).FindSubmatch(readme)
	if m == nil {
		t.Fatal("the README's unlimited client call is not where this test looks")
	}
	var want []string
	for _, line := range strings.Split(strings.TrimSpace(string(m[2])), "\n") {
		l := strings.TrimPrefix(line, "# ")
		if strings.HasPrefix(l, "(") {
			break // the README's note on the answer
		}
		want = append(want, l)
	}
	if got := run(strings.Fields(string(m[1]))...); strings.TrimSpace(got) != strings.Join(want, "\n") {
		t.Errorf("the README's call prints\n%s\nwhere the README shows\n%s", got, strings.Join(want, "\n"))
	}
	if got := run("-domain", "nosuch", "-descriptors", "a=b"); !strings.Contains(got, "  a=b: OK (unknown domain)\n") {
		t.Errorf("an unknown domain prints\n%s", got)
	}
	if got := run("-domain", "example", "-descriptors", "generic_key=demo"); !strings.Contains(got, "  generic_key=demo: OK, limit 1/minute, remaining 0, reset in ") {
		t.Errorf("a limited call prints\n%s", got)
	}
}
