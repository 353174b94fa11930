package examples

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
)

// anchors returns the GitHub anchors of a Markdown file's headings.
func anchors(doc string) map[string]bool {
	out := map[string]bool{}
	for _, m := range mdHeading.FindAllStringSubmatch(doc, -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
				b.WriteRune(r)
			}
		}
		out[b.String()] = true
	}
	return out
}

// TestDocsLinks: the README stays short, and every relative link in it and
// in docs/ points at a file that exists (and a heading that exists, for
// links with an anchor).
func TestDocsLinks(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(readme) > 8192 {
		t.Errorf("README.md is %d bytes; keep it under 8 KB and move detail to docs/", len(readme))
	}
	files, _ := filepath.Glob("../docs/*.md")
	files = append(files, "../README.md", "kubernetes/README.md")
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(string(data), -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			target, anchor, _ := strings.Cut(link, "#")
			path := f
			if target != "" {
				path = filepath.Join(filepath.Dir(f), target)
			}
			body, err := os.ReadFile(path)
			if err != nil {
				t.Errorf("%s links to %s, which does not exist", f, link)
				continue
			}
			if anchor != "" && !anchors(string(body))[anchor] {
				t.Errorf("%s links to %s, but %s has no heading #%s", f, link, path, anchor)
			}
		}
	}
}
