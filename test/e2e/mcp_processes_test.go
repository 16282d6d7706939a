//go:build mcp_e2e && linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"context"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// Background commands with handles (issue 26), through a real MCP client
// and the Docker backend. The times are scaled down from the (a
// 150 s command under a 60 s client timeout) to keep the suite quick: an
// 8 s command under a 4 s client timeout (room for a loaded machine), with a
// 1 s yield.
var _ = Describe("code-sandbox-mcp background commands over stdio", Ordered, func() {
	var (
		srv  *mcpServer
		sess *mcp.ClientSession
		id   string
	)

	BeforeAll(func(ctx SpecContext) {
		srv = startStdio(ctx, nil)
		sess = srv.session
		DeferCleanup(func() { srv.stop() })
		id = initSandbox(ctx, sess, nil)
	})

	// waitDone calls exec_wait in short steps, each under a client timeout
	// of 4 s, and collects the output until the process has exited.
	waitDone := func(ctx context.Context, handle string, stdoutOff float64) (stdout string, final map[string]any) {
		GinkgoHelper()
		var b strings.Builder
		for i := 0; i < 60; i++ {
			short, cancel := context.WithTimeout(ctx, 4*time.Second)
			res, err := sess.CallTool(short, &mcp.CallToolParams{Name: "exec_wait", Arguments: map[string]any{
				"container_id": id, "handle": handle, "timeout_seconds": 1, "stdout_offset": stdoutOff,
			}})
			cancel()
			Expect(err).NotTo(HaveOccurred(), "exec_wait must answer within the client's 4 s")
			m := structured(res)
			b.WriteString(m["stdout"].(string))
			stdoutOff = m["stdout_next"].(float64)
			if m["state"] != "running" {
				return b.String(), m
			}
		}
		Fail("the process never ended")
		return "", nil
	}

	It("yields a foreground command that outlives the yield, and its handle reads back the full output and exit code under a short client timeout", func(ctx SpecContext) {
		short, cancel := context.WithTimeout(ctx, 4*time.Second)
		defer cancel()
		began := time.Now()
		res, err := sess.CallTool(short, &mcp.CallToolParams{Name: "sandbox_exec", Arguments: map[string]any{
			"container_id": id, "yield_after_seconds": 1, "timeout_seconds": 120,
			"commands": []any{"for i in 1 2 3 4 5 6 7 8; do echo tick $i; sleep 1; done; echo done >&2; exit 3", "echo never"},
		}})
		Expect(err).NotTo(HaveOccurred(), "sandbox_exec must yield before the client's 4 s")
		Expect(time.Since(began)).To(BeNumerically("<", 4*time.Second))
		Expect(res.IsError).To(BeFalse(), text(res))
		m := structured(res)
		Expect(m["not_run"]).To(BeNumerically("==", 1))
		bg := m["background"].(map[string]any)
		Expect(bg["state"]).To(Equal("running"))
		handle := bg["handle"].(string)
		Expect(text(res)).To(ContainSubstring(handle))
		Expect(text(res)).To(ContainSubstring("tick 1"))

		rest, final := waitDone(ctx, handle, bg["stdout_next"].(float64))
		Expect(bg["stdout"].(string) + rest).To(Equal("tick 1\ntick 2\ntick 3\ntick 4\ntick 5\ntick 6\ntick 7\ntick 8\n"))
		Expect(final["exit_code"]).To(BeNumerically("==", 3))
		// From offset 0, everything is still there, stderr too.
		res = call(ctx, sess, "exec_poll", map[string]any{"container_id": id, "handle": handle})
		Expect(res.IsError).To(BeTrue(), "a non-zero exit is an error result")
		Expect(structured(res)["stderr"]).To(Equal("done\n"))
	})

	It("starts a background command at once, writes its stdin, lists and kills it", func(ctx SpecContext) {
		res := call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "background": true,
			"commands": []any{"read name; echo hello $name; sh -c 'sleep 5001 &'; sleep 5002"}})
		Expect(res.IsError).To(BeFalse(), text(res))
		handle := structured(res)["background"].(map[string]any)["handle"].(string)
		res = call(ctx, sess, "exec_write_stdin", map[string]any{"container_id": id, "handle": handle, "data": "world\n"})
		Expect(res.IsError).To(BeFalse(), text(res))
		Eventually(func() string {
			return structured(call(ctx, sess, "exec_poll", map[string]any{"container_id": id, "handle": handle}))["stdout"].(string)
		}).WithTimeout(10 * time.Second).Should(Equal("hello world\n"))
		res = call(ctx, sess, "exec_list", map[string]any{"container_id": id})
		Expect(text(res)).To(ContainSubstring(handle))
		res = call(ctx, sess, "exec_kill", map[string]any{"container_id": id, "handle": handle})
		Expect(res.IsError).To(BeFalse(), text(res))
		Expect(structured(res)["exit_code"]).To(BeNumerically("==", 137))
		res = call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []any{"ps -o args | grep '[s]leep 500' || true"}})
		Expect(structured(res)["results"].([]any)[0].(map[string]any)["stdout"]).To(BeEmpty(), "the tree survived exec_kill")
	})

	It("answers bad handles and another sandbox's handle with an error result the model can act on", func(ctx SpecContext) {
		res := call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "background": true, "commands": []any{"sleep 30"}})
		handle := structured(res)["background"].(map[string]any)["handle"].(string)
		other := initSandbox(ctx, sess, nil)
		for _, h := range []string{handle, "../../etc/passwd", "x y", ""} {
			res := call(ctx, sess, "exec_poll", map[string]any{"container_id": other, "handle": h})
			Expect(res.IsError).To(BeTrue(), "handle %q", h)
			if h != "" {
				Expect(text(res)).To(ContainSubstring("Handles belong to one sandbox"), "handle %q", h)
				Expect(text(res)).NotTo(ContainSubstring("Internal error"), "handle %q", h)
			}
		}
		res = call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "background": true, "commands": []any{"true", "true"}})
		Expect(res.IsError).To(BeTrue())
		Expect(text(res)).To(ContainSubstring("exactly one command"))
	})
})
