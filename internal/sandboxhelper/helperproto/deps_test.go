/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package helperproto_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/code-sandbox/code-sandbox-operator"

// goListDeps runs `go list -deps` on pkgs from the module root.
func goListDeps(t *testing.T, pkgs ...string) []string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list dependencies: %v", err)
	}
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command(goTool, append([]string{"list", "-deps"}, pkgs...)...)
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..", "..")
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps %v: %v\n%s", pkgs, err, stderr)
	}
	return strings.Fields(string(out))
}

// The manager and the MCP server speak the helper's protocol but must not
// link the helper itself, which runs only inside sandboxes.
func TestServersDoNotLinkTheHelper(t *testing.T) {
	for _, dep := range goListDeps(t, "./cmd/manager", "./cmd/code-sandbox-mcp") {
		if dep == module+"/internal/sandboxhelper" || strings.HasPrefix(dep, module+"/cmd/code-sandbox-helper") {
			t.Errorf("the manager or the MCP server links %s; import internal/sandboxhelper/helperproto instead", dep)
		}
	}
}

// helperproto stays a leaf: of this module it imports only execio (whose
// sentinel errors its Error unwraps to), and execio imports nothing from it.
func TestProtocolIsALeaf(t *testing.T) {
	var inModule []string
	for _, dep := range goListDeps(t, "./internal/sandboxhelper/helperproto") {
		if strings.HasPrefix(dep, module+"/") {
			inModule = append(inModule, strings.TrimPrefix(dep, module+"/"))
		}
	}
	slices.Sort(inModule)
	want := []string{"internal/execio", "internal/sandboxhelper/helperproto"}
	if !slices.Equal(inModule, want) {
		t.Errorf("helperproto depends on %v in this module; want only %v", inModule, want)
	}
}
