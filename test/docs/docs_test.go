// Package docs checks the documentation's shape: a short front door, and no
// relative link that points at a file or heading that is not there.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const repoRoot = "../.."

// The README is the front door; reference material belongs in docs/.
const maxReadmeLines = 200

func TestReadmeIsShort(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), "\n"); n > maxReadmeLines {
		t.Errorf("README.md has %d lines, at most %d: move reference material to docs/", n, maxReadmeLines)
	}
}

var (
	markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	fencedBlock  = regexp.MustCompile("(?s)```.*?```")
	headingLine  = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
	anchorStrip  = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// githubAnchor mirrors how GitHub turns a heading into a fragment.
func githubAnchor(heading string) string {
	a := strings.ToLower(strings.TrimSpace(heading))
	a = anchorStrip.ReplaceAllString(a, "")
	return strings.ReplaceAll(a, " ", "-")
}

func anchorsOf(t *testing.T, path string) map[string]bool {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	text := fencedBlock.ReplaceAllString(string(data), "")
	anchors := map[string]bool{}
	for _, m := range headingLine.FindAllStringSubmatch(text, -1) {
		anchors[githubAnchor(m[1])] = true
	}
	return anchors
}

func TestRelativeLinksResolve(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(repoRoot, "README.md"), filepath.Join(repoRoot, "CONTRIBUTING.md"))
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		text := fencedBlock.ReplaceAllString(string(data), "")
		for _, m := range markdownLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, fragment, _ := strings.Cut(target, "#")
			resolved := file
			if path != "" {
				resolved = filepath.Join(filepath.Dir(file), path)
				if _, err := os.Stat(resolved); err != nil {
					t.Errorf("%s links to %q, which does not exist", rel(file), target)
					continue
				}
			}
			if fragment != "" && strings.HasSuffix(resolved, ".md") && !anchorsOf(t, resolved)[fragment] {
				t.Errorf("%s links to %q, but %s has no such heading", rel(file), target, rel(resolved))
			}
		}
	}
}

func rel(path string) string {
	r, err := filepath.Rel(repoRoot, path)
	if err != nil {
		return path
	}
	return r
}
