//go:build mcp_e2e && linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/fstree"
)

// The tools spec runs once per MCP revision the server serves, with the
// official Go SDK client held to that revision.
var _ = toolsOverStdio("2025-11-25")
var _ = toolsOverStdio("2026-07-28")

func toolsOverStdio(revision string) bool {
	return Describe("code-sandbox-mcp tools over stdio, MCP "+revision, Ordered, func() { toolsSpecs(revision) })
}

// toolsSpecs are the tools spec for one MCP revision.
func toolsSpecs(revision string) {
	var (
		srv      *mcpServer
		sess     *mcp.ClientSession
		hostDir  string
		outside  string
		id       string
		progMu   sync.Mutex
		progress []*mcp.ProgressNotificationParams
		logs     []*mcp.LoggingMessageParams
	)

	BeforeAll(func(ctx SpecContext) {
		hostDir = filepath.Join(mcpWorkDir, "host-"+revision)
		outside = filepath.Join(mcpWorkDir, "outside-"+revision)
		Expect(os.MkdirAll(filepath.Join(hostDir, "proj", "pkg"), 0o755)).To(Succeed())
		Expect(os.MkdirAll(outside, 0o755)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(hostDir, "proj", "main.py"), []byte("print('hello from main')\n"), 0o644)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(hostDir, "proj", "pkg", "data.txt"), []byte("data\n"), 0o644)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(outside, "secret.txt"), []byte("TOP SECRET\n"), 0o600)).To(Succeed())
		// Symlinks that would lead out of the allowed root.
		Expect(os.Symlink(filepath.Join(outside, "secret.txt"), filepath.Join(hostDir, "proj", "leak.txt"))).To(Succeed())
		Expect(os.Symlink(outside, filepath.Join(hostDir, "escape"))).To(Succeed())

		opts := &mcp.ClientOptions{
			ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
				progMu.Lock()
				progress = append(progress, r.Params)
				progMu.Unlock()
			},
			LoggingMessageHandler: func(_ context.Context, r *mcp.LoggingMessageRequest) {
				progMu.Lock()
				logs = append(logs, r.Params)
				progMu.Unlock()
			},
		}
		srv = startStdioSession(ctx, opts, &mcp.ClientSessionOptions{ProtocolVersion: revision}, "--allow-host-dir", hostDir, "--output-limit", "64KiB")
		sess = srv.session
		DeferCleanup(func() { srv.stop() })
		Expect(sess.InitializeResult().ProtocolVersion).To(Equal(revision))
	})

	It("lists every tool with annotations and the logs resource template", func(ctx SpecContext) {
		tools, err := sess.ListTools(ctx, nil)
		Expect(err).NotTo(HaveOccurred())
		names := map[string]*mcp.Tool{}
		for _, t := range tools.Tools {
			names[t.Name] = t
		}
		for _, n := range []string{"sandbox_initialize", "copy_project", "write_file", "sandbox_exec", "copy_file", "sandbox_stop", "copy_file_from_sandbox", "read_file", "list_sandboxes"} {
			Expect(names).To(HaveKey(n))
			Expect(names[n].Annotations).NotTo(BeNil())
			Expect(names[n].OutputSchema).NotTo(BeNil())
		}
		Expect(names["read_file"].Annotations.ReadOnlyHint).To(BeTrue())
		Expect(*names["sandbox_stop"].Annotations.DestructiveHint).To(BeTrue())
		tmpls, err := sess.ListResourceTemplates(ctx, nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(tmpls.ResourceTemplates).To(ContainElement(HaveField("URITemplate", "containers://{id}/logs")))
	})

	It("creates a sandbox with the default image", func(ctx SpecContext) {
		id = initSandbox(ctx, sess, nil)
		Expect(containersOf(ctx, srv.instance())).To(HaveLen(1))
		res := call(ctx, sess, "list_sandboxes", nil)
		Expect(res.IsError).To(BeFalse())
		Expect(text(res)).To(ContainSubstring(id))
		Expect(text(res)).To(ContainSubstring(mcpImage))
	})

	It("runs commands in order and reports each one", func(ctx SpecContext) {
		res := call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"echo one", "echo two >&2", "id -u"}})
		Expect(res.IsError).To(BeFalse(), text(res))
		results := structured(res)["results"].([]any)
		Expect(results).To(HaveLen(3))
		Expect(results[0]).To(HaveKeyWithValue("stdout", "one\n"))
		Expect(results[1]).To(HaveKeyWithValue("stderr", "two\n"))
		Expect(results[2]).To(HaveKeyWithValue("stdout", "65534\n"))
		Expect(results[0]).To(HaveKey("duration_ms"))
		Expect(text(res)).To(ContainSubstring("$ echo one"))
	})

	It("stops at the first failing command and marks the result as an error", func(ctx SpecContext) {
		res := call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"true", "exit 3", "echo never"}})
		Expect(res.IsError).To(BeTrue())
		st := structured(res)
		Expect(st["results"]).To(HaveLen(2))
		Expect(st["results"].([]any)[1]).To(HaveKeyWithValue("exit_code", BeNumerically("==", 3)))
		Expect(st["not_run"]).To(BeNumerically("==", 1))
		Expect(text(res)).To(ContainSubstring("exit code 3"))
	})

	It("passes workdir and env, and rejects a bad workdir", func(ctx SpecContext) {
		res := call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"pwd; echo $GREETING"}, "workdir": "/tmp", "env": map[string]string{"GREETING": "hi there"}})
		Expect(res.IsError).To(BeFalse(), text(res))
		Expect(structured(res)["results"].([]any)[0]).To(HaveKeyWithValue("stdout", "/tmp\nhi there\n"))
		res = call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"pwd"}, "workdir": "/proc/self/fd/7"})
		Expect(res.IsError).To(BeTrue())
		Expect(text(res)).To(ContainSubstring("/proc"))
	})

	It("streams output while the command runs, before the result", func(ctx SpecContext) {
		progMu.Lock()
		progress, logs = nil, nil
		progMu.Unlock()
		meta := mcp.Meta{"progressToken": "tok-1"}
		if revision < "2026-07-28" {
			Expect(sess.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "info"})).To(Succeed())
		} else {
			// 2026-07-28 removed logging/setLevel: a request asks for
			// its own log messages.
			meta["io.modelcontextprotocol/logLevel"] = "info"
		}
		done := make(chan *mcp.CallToolResult, 1)
		go func() {
			defer GinkgoRecover()
			res, err := sess.CallTool(ctx, &mcp.CallToolParams{
				Name:      "sandbox_exec",
				Arguments: map[string]any{"container_id": id, "commands": []string{"echo first; sleep 3; echo second"}},
				Meta:      meta,
			})
			Expect(err).NotTo(HaveOccurred())
			done <- res
		}()
		Eventually(func() string {
			progMu.Lock()
			defer progMu.Unlock()
			var b strings.Builder
			for _, p := range progress {
				b.WriteString(p.Message)
			}
			return b.String()
		}).WithTimeout(2500 * time.Millisecond).Should(ContainSubstring("first"))
		Consistently(done).WithTimeout(500 * time.Millisecond).ShouldNot(Receive())
		var res *mcp.CallToolResult
		Eventually(done).WithTimeout(30 * time.Second).Should(Receive(&res))
		Expect(res.IsError).To(BeFalse(), text(res))
		progMu.Lock()
		defer progMu.Unlock()
		Expect(progress[0].ProgressToken).To(Equal("tok-1"))
		Expect(logs).NotTo(BeEmpty())
		Expect(logs[0].Logger).To(Equal("sandbox_exec"))
	})

	It("logs a call only at the level its request asks for", func(ctx SpecContext) {
		if revision < "2026-07-28" {
			Skip("per-request log levels are a 2026-07-28 feature")
		}
		logCount := func() int {
			progMu.Lock()
			defer progMu.Unlock()
			return len(logs)
		}
		exec := func(meta mcp.Meta) {
			res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_exec", Meta: meta,
				Arguments: map[string]any{"container_id": id, "commands": []string{"echo hello"}}})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.IsError).To(BeFalse(), text(res))
		}
		// A server MUST NOT send notifications/message for a request
		// without io.modelcontextprotocol/logLevel, nor below its level.
		for _, meta := range []mcp.Meta{nil, {"io.modelcontextprotocol/logLevel": "error"}} {
			before := logCount()
			exec(meta)
			Consistently(logCount).WithTimeout(300*time.Millisecond).Should(Equal(before), "meta %v", meta)
		}
		before := logCount()
		exec(mcp.Meta{"io.modelcontextprotocol/logLevel": "debug"})
		Eventually(logCount).Should(BeNumerically(">", before))
	})

	It("kills a command at its timeout and reports timed_out", func(ctx SpecContext) {
		start := time.Now()
		res := call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"true"}})
		Expect(res.IsError).To(BeFalse(), text(res))
		baseline := time.Since(start)
		start = time.Now()
		res = call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"sleep 1000 & sleep 1000"}, "timeout_seconds": 2})
		// Relative to a trivial call just measured: the 2 s timeout plus ten
		// of those (at least 3 s); a tree not killed runs 1000 s.
		Expect(time.Since(start)).To(BeNumerically("<", 2*time.Second+max(3*time.Second, 10*baseline)))
		Expect(res.IsError).To(BeTrue())
		Expect(structured(res)["results"].([]any)[0]).To(HaveKeyWithValue("timed_out", true))
		res = call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"ps -eo comm | grep -c sleep || true"}})
		Expect(structured(res)["results"].([]any)[0]).To(HaveKeyWithValue("stdout", "0\n"))
	})

	It("caps output and says so", func(ctx SpecContext) {
		res := call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"yes | head -c 1000000"}})
		Expect(res.IsError).To(BeFalse(), text(res))
		r := structured(res)["results"].([]any)[0].(map[string]any)
		Expect(r["truncated"]).To(BeTrue())
		Expect(len(r["stdout"].(string))).To(BeNumerically("<", 70<<10))
	})

	It("writes, reads and copies files", func(ctx SpecContext) {
		res := call(ctx, sess, "write_file", map[string]any{"container_id": id, "file_name": "hello.py", "file_contents": "print('hi from file')\n", "dest_dir": "src"})
		Expect(res.IsError).To(BeFalse(), text(res))
		res = call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"python3 src/hello.py"}})
		Expect(structured(res)["results"].([]any)[0]).To(HaveKeyWithValue("stdout", "hi from file\n"))

		res = call(ctx, sess, "read_file", map[string]any{"container_id": id, "path": "/app/src/hello.py"})
		Expect(res.IsError).To(BeFalse(), text(res))
		Expect(structured(res)).To(HaveKeyWithValue("encoding", "utf-8"))
		Expect(text(res)).To(Equal("print('hi from file')\n"))

		call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"printf '\\000\\377\\001' > bin.dat"}})
		res = call(ctx, sess, "read_file", map[string]any{"container_id": id, "path": "bin.dat"})
		Expect(res.IsError).To(BeFalse(), text(res))
		Expect(structured(res)).To(HaveKeyWithValue("encoding", "base64"))
		Expect(structured(res)["content"]).To(Equal(base64.StdEncoding.EncodeToString([]byte{0, 0xff, 1})))

		res = call(ctx, sess, "copy_project", map[string]any{"container_id": id, "local_src_dir": filepath.Join(hostDir, "proj"), "dest_dir": "/app/proj"})
		Expect(res.IsError).To(BeFalse(), text(res))
		Expect(structured(res)["skipped"]).To(ContainElement(ContainSubstring("leak.txt")))
		res = call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"python3 proj/main.py", "cat proj/pkg/data.txt", "test ! -e proj/leak.txt"}})
		Expect(res.IsError).To(BeFalse(), text(res))
		Expect(text(res)).To(ContainSubstring("hello from main"))

		res = call(ctx, sess, "copy_file", map[string]any{"container_id": id, "local_src_file": filepath.Join(hostDir, "proj", "main.py"), "dest_path": "/tmp/copied.py"})
		Expect(res.IsError).To(BeFalse(), text(res))
		res = call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"python3 /tmp/copied.py"}})
		Expect(text(res)).To(ContainSubstring("hello from main"))

		dest := filepath.Join(hostDir, "out", "result.py")
		res = call(ctx, sess, "copy_file_from_sandbox", map[string]any{"container_id": id, "container_src_path": "src/hello.py", "local_dest_path": dest})
		Expect(res.IsError).To(BeFalse(), text(res))
		Expect(os.ReadFile(dest)).To(Equal([]byte("print('hi from file')\n")))
	})

	It("confines host paths to the allowed roots, symlinks included", func(ctx SpecContext) {
		for _, p := range []string{filepath.Join(outside, "secret.txt"), filepath.Join(hostDir, "proj", "leak.txt"), filepath.Join(hostDir, "escape", "secret.txt"), "/etc/passwd", "relative.txt", filepath.Join(hostDir, "..", filepath.Base(outside), "secret.txt")} {
			res := call(ctx, sess, "copy_file", map[string]any{"container_id": id, "local_src_file": p})
			Expect(res.IsError).To(BeTrue(), p)
			Expect(text(res)).To(Or(ContainSubstring("outside the allowed"), ContainSubstring("absolute")), p)
		}
		res := call(ctx, sess, "copy_project", map[string]any{"container_id": id, "local_src_dir": filepath.Join(hostDir, "escape")})
		Expect(res.IsError).To(BeTrue())
		Expect(text(res)).To(ContainSubstring("outside the allowed"))

		for _, p := range []string{filepath.Join(outside, "x.txt"), filepath.Join(hostDir, "escape", "x.txt"), filepath.Join(hostDir, "escape")} {
			res := call(ctx, sess, "copy_file_from_sandbox", map[string]any{"container_id": id, "container_src_path": "src/hello.py", "local_dest_path": p})
			Expect(res.IsError).To(BeTrue(), p)
			Expect(text(res)).To(ContainSubstring("outside the allowed"), p)
		}
		Expect(filepath.Join(outside, "x.txt")).NotTo(BeAnExistingFile())
		Expect(os.ReadFile(filepath.Join(outside, "secret.txt"))).To(Equal([]byte("TOP SECRET\n")))
	})

	It("copies from the sandbox only what was asked for: no planted tree, no overwrite, no exec bits", func(ctx SpecContext) {
		// The user's project, into which a report is downloaded.
		project := filepath.Join(hostDir, "project")
		Expect(os.MkdirAll(filepath.Join(project, ".git", "hooks"), 0o755)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(project, "Makefile"), []byte("mine\n"), 0o644)).To(Succeed())
		before := fstree.List(project)

		// Code in the sandbox turns report.txt into a directory of things
		// that run on the host once merged into a project.
		res := call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{
			"rm -rf /app/report.txt && mkdir -p /app/report.txt/.git/hooks && printf '#!/bin/sh\\necho pwned\\n' > /app/report.txt/.git/hooks/pre-commit && chmod 755 /app/report.txt/.git/hooks/pre-commit && echo 'echo pwned' > /app/report.txt/.envrc && echo 'all:' > /app/report.txt/Makefile",
		}})
		Expect(res.IsError).To(BeFalse(), text(res))
		for _, args := range []map[string]any{
			{"container_id": id, "container_src_path": "/app/report.txt", "local_dest_path": project},
			{"container_id": id, "container_src_path": "report.txt", "local_dest_path": filepath.Join(project, "report.txt"), "overwrite": true, "keep_exec_bits": true},
		} {
			res = call(ctx, sess, "copy_file_from_sandbox", args)
			Expect(res.IsError).To(BeTrue(), text(res))
			Expect(text(res)).To(ContainSubstring("report.txt is a directory in the sandbox, but a file was asked for"))
			Expect(fstree.List(project)).To(Equal(before))
		}

		// A file with every mode bit set: no exec bits unless asked, never
		// group/world-writable; an existing file replaced only on request.
		res = call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"echo tool > /app/tool.sh && chmod 777 /app/tool.sh"}})
		Expect(res.IsError).To(BeFalse(), text(res))
		res = call(ctx, sess, "copy_file_from_sandbox", map[string]any{"container_id": id, "container_src_path": "tool.sh", "local_dest_path": project})
		Expect(res.IsError).To(BeFalse(), text(res))
		fi, err := os.Stat(filepath.Join(project, "tool.sh"))
		Expect(err).NotTo(HaveOccurred())
		Expect(fi.Mode().Perm()&0o133).To(BeZero(), "mode %v", fi.Mode())

		res = call(ctx, sess, "copy_file_from_sandbox", map[string]any{"container_id": id, "container_src_path": "tool.sh", "local_dest_path": project, "keep_exec_bits": true})
		Expect(res.IsError).To(BeTrue(), text(res))
		Expect(text(res)).To(ContainSubstring("exists"))

		res = call(ctx, sess, "copy_file_from_sandbox", map[string]any{"container_id": id, "container_src_path": "tool.sh", "local_dest_path": project, "keep_exec_bits": true, "overwrite": true})
		Expect(res.IsError).To(BeFalse(), text(res))
		fi, err = os.Stat(filepath.Join(project, "tool.sh"))
		Expect(err).NotTo(HaveOccurred())
		Expect(fi.Mode().Perm()&0o111).NotTo(BeZero(), "mode %v", fi.Mode())
		Expect(fi.Mode().Perm()&0o022).To(BeZero(), "mode %v", fi.Mode())

		// A directory asked for with a trailing / lands as a new directory.
		res = call(ctx, sess, "copy_file_from_sandbox", map[string]any{"container_id": id, "container_src_path": "/app/report.txt/", "local_dest_path": filepath.Join(hostDir, "quarantine")})
		Expect(res.IsError).To(BeFalse(), text(res))
		Expect(filepath.Join(hostDir, "quarantine", ".git", "hooks", "pre-commit")).To(BeARegularFile())
		Expect(filepath.Join(project, ".git", "hooks", "pre-commit")).NotTo(BeAnExistingFile())
	})

	It("confines sandbox paths: traversal and paths outside the writable roots are refused", func(ctx SpecContext) {
		for _, p := range []string{"../../etc/passwd", "/etc/passwd", "a/../../x", "", strings.Repeat("a", 5000), "x\x00y"} {
			res := call(ctx, sess, "read_file", map[string]any{"container_id": id, "path": p})
			Expect(res.IsError).To(BeTrue(), "path %q", p)
		}
		res := call(ctx, sess, "write_file", map[string]any{"container_id": id, "file_name": "../../etc/evil", "file_contents": "x"})
		Expect(res.IsError).To(BeTrue())
		res = call(ctx, sess, "write_file", map[string]any{"container_id": id, "file_name": "/etc/evil", "file_contents": "x"})
		Expect(res.IsError).To(BeTrue())
		// A symlink planted inside the sandbox is resolved inside it only.
		call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"ln -s / /app/out"}})
		res = call(ctx, sess, "read_file", map[string]any{"container_id": id, "path": "out/etc/passwd"})
		Expect(res.IsError).To(BeTrue(), text(res))
	})

	It("answers bad and missing arguments with actionable tool errors", func(ctx SpecContext) {
		cases := []struct {
			tool string
			args map[string]any
			want string
		}{
			{"sandbox_exec", map[string]any{"container_id": id}, "commands"},
			{"sandbox_exec", map[string]any{"container_id": id, "commands": "echo hi"}, "array"},
			{"sandbox_exec", map[string]any{"container_id": id, "commands": []string{"true"}, "timeout_seconds": -1}, "timeout_seconds"},
			{"sandbox_exec", map[string]any{"container_id": id, "commands": []string{"true"}, "timeout_seconds": "soon"}, "timeout_seconds"},
			{"sandbox_exec", map[string]any{"commands": []string{"true"}}, "container_id"},
			{"sandbox_exec", map[string]any{"container_id": id, "commands": []string{"true"}, "bogus": 1}, "bogus"},
			{"sandbox_initialize", map[string]any{"network": "host"}, "network"},
			{"sandbox_initialize", map[string]any{"network": "egress"}, "allow-egress"},
			{"sandbox_initialize", map[string]any{"memory": "lots"}, "memory"},
			{"sandbox_initialize", map[string]any{"cpu": 1000}, "cpu"},
			{"sandbox_initialize", map[string]any{"lifetime_seconds": 0}, "lifetime_seconds"},
			{"write_file", map[string]any{"container_id": id, "file_name": "x"}, "file_contents"},
			{"read_file", map[string]any{"container_id": id}, "path"},
			{"sandbox_stop", map[string]any{}, "container_id"},
		}
		for _, c := range cases {
			res := call(ctx, sess, c.tool, c.args)
			Expect(res.IsError).To(BeTrue(), "%s %v", c.tool, c.args)
			Expect(text(res)).To(ContainSubstring(c.want), "%s %v", c.tool, c.args)
		}
	})

	It("reports a missing image with what to do about it", func(ctx SpecContext) {
		res := call(ctx, sess, "sandbox_initialize", map[string]any{"image": "code-sandbox-test/does-not-exist:1"})
		Expect(res.IsError).To(BeTrue())
		Expect(text(res)).To(ContainSubstring("docker pull"))
	})

	It("answers unknown container ids with not found", func(ctx SpecContext) {
		unknown := "0123456789abcdef01234567"
		for tool, args := range map[string]map[string]any{
			"sandbox_exec": {"container_id": unknown, "commands": []string{"true"}},
			"read_file":    {"container_id": unknown, "path": "x"},
			"write_file":   {"container_id": unknown, "file_name": "x", "file_contents": ""},
			"sandbox_stop": {"container_id": unknown},
		} {
			res := call(ctx, sess, tool, args)
			Expect(res.IsError).To(BeTrue(), tool)
			Expect(text(res)).To(ContainSubstring("not found"), tool)
		}
		_, err := sess.ReadResource(ctx, &mcp.ReadResourceParams{URI: "containers://0123456789abcdef01234567/logs"})
		Expect(err).To(HaveOccurred())
	})

	It("serves the logs resource with the exec history", func(ctx SpecContext) {
		res, err := sess.ReadResource(ctx, &mcp.ReadResourceParams{URI: "containers://" + id + "/logs"})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Contents).To(HaveLen(1))
		Expect(res.Contents[0].MIMEType).To(Equal("text/plain"))
		Expect(res.Contents[0].Text).To(ContainSubstring("== exec history =="))
		Expect(res.Contents[0].Text).To(ContainSubstring("echo one"))
	})

	It("enforces the per-client sandbox limit", func(ctx SpecContext) {
		var ids []string
		for range 4 {
			ids = append(ids, initSandbox(ctx, sess, nil))
		}
		res := call(ctx, sess, "sandbox_initialize", nil)
		Expect(res.IsError).To(BeTrue())
		Expect(text(res)).To(ContainSubstring("limit"))
		for _, x := range ids {
			Expect(call(ctx, sess, "sandbox_stop", map[string]any{"container_id": x}).IsError).To(BeFalse())
		}
	})

	It("stops a sandbox and removes its container", func(ctx SpecContext) {
		res := call(ctx, sess, "sandbox_stop", map[string]any{"container_id": id})
		Expect(res.IsError).To(BeFalse(), text(res))
		Expect(containersOf(ctx, srv.instance())).To(BeEmpty())
		res = call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"true"}})
		Expect(res.IsError).To(BeTrue())
		Expect(text(res)).To(ContainSubstring("not found"))
	})
}
