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

	"github.com/modelcontextprotocol/go-sdk/mcp"
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

	It("neither pauses nor removes an unpolled sandbox while a background command runs, and does both once it has ended", func(ctx SpecContext) {
		// Without the reaper asking the sandbox, it would be paused after
		// 2 s and removed after 6 s: the command runs 12 s with no tool call.
		srv := startStdio(ctx, nil, "--idle-pause", "2s", "--idle-timeout", "6s")
		DeferCleanup(srv.stop)
		id := initSandbox(ctx, srv.session, nil)
		container := "code-sandbox-" + id
		state := func() string {
			out, err := exec.CommandContext(ctx, "docker", "inspect", "-f", "{{.State.Paused}}", container).Output()
			if err != nil {
				return "gone"
			}
			return strings.TrimSpace(string(out))
		}
		res := call(ctx, srv.session, "sandbox_exec", map[string]any{"container_id": id, "background": true,
			"commands": []string{"i=0; while [ $i -lt 12 ]; do echo tick $i; i=$((i+1)); sleep 1; done; exit 4"}})
		Expect(res.IsError).To(BeFalse(), text(res))
		handle, _ := structured(res)["background"].(map[string]any)["handle"].(string)
		Expect(handle).NotTo(BeEmpty(), text(res))

		began := time.Now()
		Consistently(state).WithTimeout(11*time.Second).WithPolling(250*time.Millisecond).Should(Equal("false"),
			"frozen or removed while its background command ran:\n%s", srv.stderr.String())
		Expect(srv.stderr.String()).NotTo(ContainSubstring("paused an idle sandbox"))

		res = call(ctx, srv.session, "exec_wait", map[string]any{"container_id": id, "handle": handle, "timeout_seconds": 20})
		st := structured(res)
		Expect(st).To(HaveKeyWithValue("state", "exited"), text(res))
		Expect(st).To(HaveKeyWithValue("exit_code", BeNumerically("==", 4)))
		Expect(st["stdout"]).To(HavePrefix("tick 0\ntick 1\n"))
		Expect(st["stdout"]).To(HaveSuffix("tick 11\n"))
		// 12 s of sleeps: it ran to its end, never frozen.
		Expect(time.Since(began)).To(BeNumerically("<", 15*time.Second))

		By("idle once the command has ended: paused, then removed")
		Eventually(state).WithTimeout(20*time.Second).WithPolling(250*time.Millisecond).Should(Equal("true"), srv.stderr.String())
		Eventually(state).WithTimeout(30*time.Second).WithPolling(250*time.Millisecond).Should(Equal("gone"), srv.stderr.String())
	})

	It("hands out a paused warm-pool member on sandbox_initialize (--warm-pool), refills, and leaves nothing behind on exit", func(ctx SpecContext) {
		srv := startStdio(ctx, nil, "--warm-pool", "2")
		instance := srv.instance()
		members := func() []string {
			out, err := exec.CommandContext(ctx, "docker", "ps", "-q", "--no-trunc", "--filter", "label="+mcpManagedByLabel,
				"--filter", "label="+mcpNodeLabel+"="+instance, "--filter", "label=sandbox.code-sandbox.dev/sandbox-namespace=warm-pool",
				"--filter", "status=paused").Output()
			Expect(err).NotTo(HaveOccurred())
			return strings.Fields(string(out))
		}
		Eventually(members).WithTimeout(60*time.Second).WithPolling(250*time.Millisecond).Should(HaveLen(2), "stderr:\n%s", srv.stderr.String())
		before := members()

		id := initSandbox(ctx, srv.session, nil)
		out, err := exec.CommandContext(ctx, "docker", "inspect", "-f", "{{.Id}}", "code-sandbox-"+id).Output()
		Expect(err).NotTo(HaveOccurred())
		Expect(before).To(ContainElement(strings.TrimSpace(string(out))), "the sandbox is not one of the pool's members")
		// Thawed in the background right after the claim.
		Eventually(func() string {
			out, _ := exec.CommandContext(ctx, "docker", "inspect", "-f", "{{.State.Paused}}", "code-sandbox-"+id).Output()
			return strings.TrimSpace(string(out))
		}).WithTimeout(30*time.Second).Should(Equal("false"), "the claimed member is still paused")

		res := call(ctx, srv.session, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"ls -A /app | wc -l", "ls -A /tmp | wc -l"}})
		Expect(res.IsError).To(BeFalse(), text(res))
		results := structured(res)["results"].([]any)
		Expect(results).To(HaveLen(2))
		Expect(results[0]).To(HaveKeyWithValue("stdout", "0\n"), "a claimed member's /app is empty")
		Expect(results[1]).To(HaveKeyWithValue("stdout", "0\n"), "a claimed member's /tmp is empty")
		logs, err := srv.session.ReadResource(ctx, &mcp.ReadResourceParams{URI: "containers://" + id + "/logs"})
		Expect(err).NotTo(HaveOccurred())
		Expect(logs.Contents[0].Text).To(ContainSubstring("ls -A /app | wc -l"))
		Expect(logs.Contents[0].Text).NotTo(ContainSubstring("check"), "the health check (helper check) is not in the history")

		// A request that is not the default one is created cold.
		cold := initSandbox(ctx, srv.session, map[string]any{"memory": "256Mi"})
		out, err = exec.CommandContext(ctx, "docker", "inspect", "-f", "{{.Id}}", "code-sandbox-"+cold).Output()
		Expect(err).NotTo(HaveOccurred())
		Expect(before).NotTo(ContainElement(strings.TrimSpace(string(out))))

		Eventually(members).WithTimeout(60 * time.Second).WithPolling(250 * time.Millisecond).Should(HaveLen(2))
		Expect(srv.session.Close()).To(Succeed())
		Expect(containersOf(ctx, instance)).To(BeEmpty(), "members or sandboxes left after exit")
	})

	It("refuses an --idle-pause that is not shorter than --idle-timeout", func(ctx SpecContext) {
		out, err := exec.CommandContext(ctx, mcpBinary, baseArgs("--idle-pause", "10m", "--idle-timeout", "5m")...).CombinedOutput()
		Expect(err).To(HaveOccurred())
		Expect(string(out)).To(ContainSubstring("--idle-pause 10m0s: want 0 (off) or a duration shorter than --idle-timeout (5m0s)"))
	})
})
