//go:build mcp_e2e && linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// One sandbox_exec of 100 commands that each write the output limit on
// both streams: the server keeps the end of each command's output within
// the call's output budget, so its memory (measured on the process, as
// VmHWM in /proc/PID/status) grows by far less than 100 × 2 × the limit.
var _ = Describe("code-sandbox-mcp sandbox_exec output budget", Ordered, func() {
	It("keeps a 100-command exec that writes the output limit on every command under 64 MiB of growth", func(ctx SpecContext) {
		srv := startStdio(ctx, nil)
		DeferCleanup(func() { srv.stop() })
		sess := srv.session
		pid := srv.cmd.Process.Pid
		id := initSandbox(ctx, sess, nil)

		const limit = 1 << 20 // the default --output-limit
		// Each command writes limit bytes to stdout and to stderr, ending
		// in a line that names it.
		cmd := func(i int) string {
			return fmt.Sprintf("yes abcdefghijklmnopqrstuvwxyz | head -c %d; echo END-OUT-%d; yes ABCDEFGHIJ | head -c %d >&2; echo END-ERR-%d >&2", limit-20, i, limit-20, i)
		}
		// Warm up: one small exec, so the baseline includes what any exec
		// allocates.
		res := call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{cmd(0)}})
		Expect(res.IsError).To(BeFalse(), text(res))
		Expect(resetPeakRSS(pid)).To(Succeed())
		before, err := procMemKiB(pid, "VmHWM")
		Expect(err).NotTo(HaveOccurred())

		commands := make([]string, 100)
		for i := range commands {
			commands[i] = cmd(i)
		}
		started := time.Now()
		res, callErr := sess.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_exec", Arguments: map[string]any{"container_id": id, "commands": commands, "timeout_seconds": 60}})
		after, err := procMemKiB(pid, "VmHWM")
		Expect(err).NotTo(HaveOccurred())
		GinkgoWriter.Printf("code-sandbox-mcp VmHWM before %d KiB, after %d KiB, growth %d KiB (%s)\n", before, after, after-before, time.Since(started))
		AddReportEntry("mcp sandbox_exec VmHWM growth KiB", after-before)
		Expect(after-before).To(BeNumerically("<", 64<<10), "code-sandbox-mcp grew by %d KiB during one sandbox_exec", after-before)

		Expect(callErr).NotTo(HaveOccurred())
		Expect(res.IsError).To(BeFalse(), text(res))
		results, _ := structured(res)["results"].([]any)
		Expect(results).To(HaveLen(100))
		total, missingEnd := 0, 0
		for i, r := range results {
			m := r.(map[string]any)
			out, _ := m["stdout"].(string)
			errOut, _ := m["stderr"].(string)
			total += len(out) + len(errOut)
			// The end of each stream is what is kept, down to the last
			// line written just before the command exited.
			if !strings.HasSuffix(out, fmt.Sprintf("END-OUT-%d\n", i)) || !strings.HasSuffix(errOut, fmt.Sprintf("END-ERR-%d\n", i)) {
				missingEnd++
				GinkgoWriter.Printf("command %d: stdout ends %q, stderr ends %q\n", i, out[max(0, len(out)-80):], errOut[max(0, len(errOut)-80):])
			}
			Expect(out).To(ContainSubstring("the first"), "a marker says the start was cut")
			Expect(m["truncated"]).To(BeTrue())
		}
		Expect(missingEnd).To(BeZero(), "commands whose kept output does not end with their last line")
		Expect(total).To(BeNumerically("<=", 2<<20+100*2*200), "the call's default output budget is 2 MiB (plus markers)")
		Expect(len(text(res))).To(BeNumerically("<", 3<<20))
	})
})
