//go:build mcp_e2e && linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"os/exec"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("code-sandbox-mcp --idle-pause (Docker backend)", func() {
	It("pauses an unused sandbox and resumes it transparently on the next sandbox_exec, with its files and processes", func(ctx SpecContext) {
		srv := startStdio(ctx, nil, "--idle-pause", "2s", "--idle-timeout", "1m")
		DeferCleanup(srv.stop)
		id := initSandbox(ctx, srv.session, nil)
		container := "code-sandbox-" + id
		paused := func() string {
			out, err := exec.CommandContext(ctx, "docker", "inspect", "-f", "{{.State.Paused}}", container).Output()
			Expect(err).NotTo(HaveOccurred())
			return strings.TrimSpace(string(out))
		}

		res := call(ctx, srv.session, "sandbox_exec", map[string]any{"container_id": id,
			"commands": []string{"echo kept > /tmp/f; sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/pid"}})
		Expect(res.IsError).To(BeFalse(), text(res))
		Expect(paused()).To(Equal("false"))

		Eventually(paused).WithTimeout(20*time.Second).WithPolling(250*time.Millisecond).Should(Equal("true"),
			"not paused after 2s without use:\n%s", srv.stderr.String())
		Expect(srv.stderr.String()).To(ContainSubstring("paused an idle sandbox"))

		res = call(ctx, srv.session, "sandbox_exec", map[string]any{"container_id": id,
			"commands": []string{"cat /tmp/f; kill -0 $(cat /tmp/pid) && echo alive"}})
		Expect(res.IsError).To(BeFalse(), text(res))
		Expect(text(res)).To(And(ContainSubstring("kept"), ContainSubstring("alive")))
		Expect(paused()).To(Equal("false"))
		Expect(srv.stderr.String()).To(ContainSubstring("resumed a paused sandbox"))

		// Paused again when unused, and sandbox_stop still removes it.
		Eventually(paused).WithTimeout(20 * time.Second).WithPolling(250 * time.Millisecond).Should(Equal("true"))
		res = call(ctx, srv.session, "sandbox_stop", map[string]any{"container_id": id})
		Expect(res.IsError).To(BeFalse(), text(res))
		Expect(exec.CommandContext(ctx, "docker", "inspect", container).Run()).To(HaveOccurred(), "the container is gone")
	})

	It("refuses an --idle-pause that is not shorter than --idle-timeout", func(ctx SpecContext) {
		out, err := exec.CommandContext(ctx, mcpBinary, baseArgs("--idle-pause", "10m", "--idle-timeout", "5m")...).CombinedOutput()
		Expect(err).To(HaveOccurred())
		Expect(string(out)).To(ContainSubstring("--idle-pause 10m0s: want 0 (off) or a duration shorter than --idle-timeout (5m0s)"))
	})
})
