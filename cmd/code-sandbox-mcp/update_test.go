/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/mcpmain"
)

// runOut runs the command line and returns its exit code, stdout and
// stderr, and whether it started the server.
func runOut(args ...string) (int, string, string, bool) {
	var stdout, stderr bytes.Buffer
	served := false
	code := run(args, &stdout, &stderr, func(mcpmain.Config) int { served = true; return 0 })
	return code, stdout.String(), stderr.String(), served
}

func TestVersionSubcommand(t *testing.T) {
	code, out, errOut, served := runOut("version")
	if code != 0 || served || !strings.HasPrefix(out, "code-sandbox-mcp ") || !strings.Contains(out, "release key: ") {
		t.Errorf("version: exit %d, served %v, stdout %q, stderr %q", code, served, out, errOut)
	}
	if code, _, _, _ := runOut("version", "extra"); code != mcpmain.ExitUsage {
		t.Errorf("version extra: exit %d", code)
	}
}

// TestUpdateRefusedInAPod: in a pod, update and the update check are
// refused with a reason, the server is not started, and stdout stays empty.
func TestUpdateRefusedInAPod(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	for _, args := range [][]string{
		{"update"},
		{"update", "--check"},
		{"update", "--rollback", "--allow-update-in-container"},
		{"--check-updates"},
		{"--check-updates", "--http", "127.0.0.1:0"},
		{"version", "--check-updates"},
	} {
		code, out, errOut, served := runOut(args...)
		if code != mcpmain.ExitUsage || served || !strings.Contains(errOut, "Kubernetes pod") {
			t.Errorf("%q: exit %d, served %v, stderr %q", args, code, served, errOut)
		}
		if strings.HasPrefix(args[0], "--") || args[0] == "update" {
			if out != "" {
				t.Errorf("%q wrote to stdout: %q", args, out)
			}
		}
	}
}

func TestUpdateUsage(t *testing.T) {
	for _, args := range [][]string{
		{"update", "now"},
		{"update", "--check", "--rollback"},
		{"update", "--no-such-flag"},
	} {
		code, out, errOut, _ := runOut(args...)
		if code != mcpmain.ExitUsage || out != "" || errOut == "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	if code, out, errOut, _ := runOut("update", "--help"); code != 0 || out != "" || !strings.Contains(errOut, "--allow-downgrade") {
		t.Errorf("update --help: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestCheckUpdatesIsNotAServerSetting: the flag leaves the server's Config
// as it is.
func TestCheckUpdatesIsNotAServerSetting(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	// The background check keeps its state in the user cache directory.
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	t.Setenv("HOME", t.TempDir())
	code, cfg, out := runWith(t, "--check-updates", "--allow-update-in-container", "--update-index-url", "http://127.0.0.1:1/none")
	if code != 0 || cfg == nil {
		t.Fatalf("exit %d: %s", code, out)
	}
	if want := mcpmain.DefaultConfig(); cfg.Backend != want.Backend || cfg.HTTPAddr != want.HTTPAddr {
		t.Errorf("--check-updates changed the Config: %+v", *cfg)
	}
}
