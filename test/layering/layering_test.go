/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package layering checks that the layering of docs/design.md#layering
// keeps up with the tree: every package under internal/ and controllers/ is
// selected by a depguard rule of its own in .golangci.yml, so that a new
// package cannot join the tree with no say about what it may import.
package layering

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const repoRoot = "../.."

// golangciConfig is the part of .golangci.yml this check reads.
type golangciConfig struct {
	Linters struct {
		Settings struct {
			Depguard struct {
				Rules map[string]struct {
					Files []string `json:"files"`
				} `json:"rules"`
			} `json:"depguard"`
		} `json:"settings"`
	} `json:"linters"`
}

// ruledTrees are the trees whose every package must have a rule.
var ruledTrees = []string{"internal", "controllers"}

func TestEveryPackageHasADepguardRule(t *testing.T) {
	rules := depguardRules(t)
	if len(rules) == 0 {
		t.Fatal("no depguard rules found in .golangci.yml")
	}
	packages := goPackages(t)
	if len(packages) < 10 {
		t.Fatalf("found only %d packages under %v; is the walk broken?", len(packages), ruledTrees)
	}
	for _, pkg := range packages {
		if names := rulesSelecting(rules, pkg); len(names) == 0 {
			t.Errorf("package %s is selected by no depguard rule of its own in .golangci.yml: add it to a rule that says what it may import, and to docs/design.md#layering", pkg)
		}
	}
}

// TestRuleMatchingSeesWhatDepguardSees pins the glob semantics the check
// relies on, so that it cannot pass by matching nothing or everything.
func TestRuleMatchingSeesWhatDepguardSees(t *testing.T) {
	rules := map[string][]*regexp.Regexp{
		"leaf":    {fileGlob("**/internal/execio/**"), fileGlob("!$test")},
		"core":    {fileGlob("**/internal/mcpserver/*.go")},
		"any":     {fileGlob("$all"), fileGlob("!**/internal/testenv/**")},
		"negated": {fileGlob("!**/internal/warmpool/**")},
	}
	for pkg, want := range map[string][]string{
		"internal/execio":           {"leaf"},
		"internal/execio/sub":       {"leaf"},
		"internal/execiox":          nil,
		"internal/mcpserver":        {"core"},
		"internal/mcpserver/driver": nil,
		"internal/warmpool":         nil,
	} {
		if got := rulesSelecting(rules, pkg); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("rulesSelecting(%s) = %v, want %v", pkg, got, want)
		}
	}
}

// depguardRules returns each rule's positive file patterns. "$all" and
// negations select no package by name, so they do not count as a rule of
// the package's own.
func depguardRules(t *testing.T) map[string][]*regexp.Regexp {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, ".golangci.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg golangciConfig
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf(".golangci.yml: %v", err)
	}
	out := map[string][]*regexp.Regexp{}
	for name, rule := range cfg.Linters.Settings.Depguard.Rules {
		for _, pattern := range rule.Files {
			out[name] = append(out[name], fileGlob(pattern))
		}
	}
	return out
}

// fileGlob turns a depguard files pattern into a regexp over a file's
// path; nil for the patterns that name no package ("$all", "$test",
// negations).
func fileGlob(pattern string) *regexp.Regexp {
	if strings.HasPrefix(pattern, "!") || strings.HasPrefix(pattern, "$") {
		return nil
	}
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(pattern); i++ {
		switch {
		case strings.HasPrefix(pattern[i:], "**/"):
			b.WriteString("(?:.*/)?")
			i += 2
		case strings.HasPrefix(pattern[i:], "**"):
			b.WriteString(".*")
			i++
		case pattern[i] == '*':
			b.WriteString("[^/]*")
		default:
			b.WriteString(regexp.QuoteMeta(pattern[i : i+1]))
		}
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

// rulesSelecting names the rules with a positive pattern that matches a
// (non-test) file of pkg, sorted.
func rulesSelecting(rules map[string][]*regexp.Regexp, pkg string) []string {
	file := "/repo/" + pkg + "/file.go"
	var names []string
	for name, patterns := range rules {
		for _, re := range patterns {
			if re != nil && re.MatchString(file) {
				names = append(names, name)
				break
			}
		}
	}
	sort.Strings(names)
	return names
}

// goPackages lists the directories under ruledTrees that hold non-test Go
// files, relative to the repository root.
func goPackages(t *testing.T) []string {
	t.Helper()
	seen := map[string]bool{}
	for _, tree := range ruledTrees {
		err := filepath.WalkDir(filepath.Join(repoRoot, tree), func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			rel, err := filepath.Rel(repoRoot, filepath.Dir(path))
			if err != nil {
				return err
			}
			seen[filepath.ToSlash(rel)] = true
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	out := make([]string, 0, len(seen))
	for pkg := range seen {
		out = append(out, pkg)
	}
	sort.Strings(out)
	return out
}
