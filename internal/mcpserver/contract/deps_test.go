/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package contract_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/code-sandbox/code-sandbox-operator"

// protocolLibraries are the MCP implementations; a protocol-free package
// links none of them.
var protocolLibraries = []string{"github.com/mark3labs/mcp-go", "github.com/modelcontextprotocol/go-sdk"}

// protocolFree are the packages below the MCP protocol: the contract, the
// session core, its drivers and authentication. depguard (the mcp-protocol-free
// rule in .golangci.yml) sees only their direct imports; this test sees what
// they link.
var protocolFree = []string{
	"internal/mcpserver/contract",
	"internal/mcpserver/session",
	"internal/mcpserver/dockerbackend",
	"internal/mcpserver/kubebackend",
	"internal/mcpserver/auth",
	"internal/mcpserver/accessreview",
}

// transitiveDeps returns every package each of pkgs links, by `go list`
// from the module root.
func transitiveDeps(t *testing.T, pkgs ...string) map[string][]string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list dependencies: %v", err)
	}
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command(goTool, append([]string{"list", "-f", `{{.ImportPath}} {{join .Deps " "}}`}, pkgs...)...)
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..", "..")
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list %v: %v\n%s", pkgs, err, stderr)
	}
	deps := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) > 0 {
			deps[strings.TrimPrefix(fields[0], module+"/")] = fields[1:]
		}
	}
	return deps
}

// speaksMCP returns the protocol packages among deps.
func speaksMCP(deps []string) []string {
	var found []string
	for _, dep := range deps {
		if slices.ContainsFunc(protocolLibraries, func(lib string) bool { return dep == lib || strings.HasPrefix(dep, lib+"/") }) ||
			dep == module+"/internal/mcpserver" {
			found = append(found, dep)
		}
	}
	return found
}

func TestBackendsAreProtocolFree(t *testing.T) {
	pkgs := make([]string, 0, len(protocolFree)+1)
	for _, p := range protocolFree {
		pkgs = append(pkgs, "./"+p)
	}
	// The server itself speaks MCP: if this check found nothing there, it
	// could not find anything anywhere.
	pkgs = append(pkgs, "./internal/mcpserver")
	deps := transitiveDeps(t, pkgs...)
	if len(speaksMCP(deps["internal/mcpserver"])) == 0 {
		t.Fatalf("internal/mcpserver links no MCP library according to go list; the check below is blind")
	}
	for _, p := range protocolFree {
		d, ok := deps[p]
		if !ok {
			t.Errorf("go list did not report %s", p)
			continue
		}
		if found := speaksMCP(d); len(found) > 0 {
			t.Errorf("%s links %v: it must stay protocol-free; move what it needs into internal/mcpserver/contract", p, found)
		}
	}
}
