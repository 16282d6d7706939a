//go:build mcp_e2e && linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	osexec "os/exec"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// The MCP Tasks extension (io.modelcontextprotocol/tasks, SEP-2663) over the
// background process handles, through the built binary and real Docker,
// spoken on the wire as MCP 2026-07-28 (no major client supports the
// extension yet, go-sdk included). The wire shapes checked are those the
// official conformance scenarios check on their fixture tools
// (tasks-lifecycle, tasks-wire-fields, tasks-request-state-removal,
// tasks-dispatch-and-envelope, tasks-request-headers), here on
// sandbox_exec.
var _ = Describe("the Tasks extension over HTTP", Ordered, Label("tasks"), func() {
	const (
		version = "2026-07-28"
		ext     = "io.modelcontextprotocol/tasks"
	)
	var (
		srv *mcpServer
		cid string
	)

	type rpcResult struct {
		sse    bool
		status int
		result map[string]any
		err    map[string]any
	}
	// rpc posts one 2026-07-28 request with its headers (Mcp-Name: name
	// unless empty) and _meta, declaring the extension when declare, and
	// returns the JSON-RPC response (the last one of an SSE stream).
	rpc := func(ctx context.Context, token, method, name string, params map[string]any, declare bool, hdr ...string) rpcResult {
		caps := map[string]any{}
		if declare {
			caps["extensions"] = map[string]any{ext: map[string]any{}}
		}
		if params == nil {
			params = map[string]any{}
		}
		meta := map[string]any{"io.modelcontextprotocol/protocolVersion": version, "io.modelcontextprotocol/clientCapabilities": caps}
		if extra, ok := params["_meta"].(map[string]any); ok {
			for k, v := range extra {
				meta[k] = v
			}
		}
		params["_meta"] = meta
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.url, bytes.NewReader(body))
		Expect(err).NotTo(HaveOccurred())
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("MCP-Protocol-Version", version)
		req.Header.Set("Mcp-Method", method)
		if name != "" {
			req.Header.Set("Mcp-Name", name)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		Expect(err).NotTo(HaveOccurred())
		msg := raw
		sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
		if sse {
			for _, line := range strings.Split(string(raw), "\n") {
				if data, ok := strings.CutPrefix(line, "data: "); ok && strings.Contains(data, `"id"`) {
					msg = []byte(data)
				}
			}
		}
		var out struct {
			Result map[string]any `json:"result"`
			Error  map[string]any `json:"error"`
		}
		Expect(json.Unmarshal(msg, &out)).To(Succeed(), "%s", raw)
		return rpcResult{sse: sse, status: resp.StatusCode, result: out.Result, err: out.Error}
	}
	exec := func(ctx context.Context, token string, args map[string]any, declare bool) rpcResult {
		return rpc(ctx, token, "tools/call", "sandbox_exec", map[string]any{"name": "sandbox_exec", "arguments": args}, declare)
	}
	get := func(ctx context.Context, token, id string) rpcResult {
		return rpc(ctx, token, "tasks/get", id, map[string]any{"taskId": id}, true)
	}
	cancel := func(ctx context.Context, token, id string) rpcResult {
		return rpc(ctx, token, "tasks/cancel", id, map[string]any{"taskId": id}, true)
	}
	// untilTerminal polls tasks/get as a client would.
	untilTerminal := func(ctx context.Context, id string) map[string]any {
		var t map[string]any
		Eventually(func() string {
			r := get(ctx, tokenA, id)
			Expect(r.err).To(BeNil())
			t = r.result
			return t["status"].(string)
		}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(BeElementOf("completed", "failed", "cancelled"))
		return t
	}
	isoTime := MatchRegexp(`^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}`)
	// expectCreateTaskResult holds r to the extension's flat
	// CreateTaskResult and returns its taskId.
	expectCreateTaskResult := func(r rpcResult) string {
		ExpectWithOffset(1, r.err).To(BeNil())
		res := r.result
		ExpectWithOffset(1, res).To(HaveKeyWithValue("resultType", "task"))
		ExpectWithOffset(1, res).To(HaveKeyWithValue("status", "working"))
		ExpectWithOffset(1, res).To(HaveKeyWithValue("taskId", HavePrefix("t1.")))
		ExpectWithOffset(1, res).To(HaveKeyWithValue("createdAt", isoTime))
		ExpectWithOffset(1, res).To(HaveKeyWithValue("lastUpdatedAt", isoTime))
		ttl, ok := res["ttlMs"].(float64)
		ExpectWithOffset(1, ok && ttl > 0 && ttl == float64(int64(ttl))).To(BeTrue(), "ttlMs must be a positive integer: %v", res["ttlMs"])
		poll, ok := res["pollIntervalMs"].(float64)
		ExpectWithOffset(1, ok && poll > 0 && poll == float64(int64(poll))).To(BeTrue(), "pollIntervalMs: %v", res["pollIntervalMs"])
		for _, k := range []string{"task", "result", "error", "inputRequests", "requestState", "ttl", "pollInterval", "content", "structuredContent"} {
			ExpectWithOffset(1, res).NotTo(HaveKey(k))
		}
		return res["taskId"].(string)
	}
	handleRE := regexp.MustCompile(`background process (p-[0-9a-f]+)`)
	handleOf := func(task map[string]any) string {
		m := handleRE.FindStringSubmatch(task["statusMessage"].(string))
		Expect(m).NotTo(BeNil(), "%v", task)
		return m[1]
	}
	// running counts the sandbox's processes whose command line starts
	// with prefix (the image has no ps).
	running := func(ctx context.Context, prefix string) string {
		r := exec(ctx, tokenA, map[string]any{"container_id": cid, "commands": []string{
			`n=0; for p in /proc/[0-9]*; do c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null); case "$c" in "` + prefix + `"*) n=$((n+1));; esac; done; echo "n=$n"`}}, false)
		Expect(r.err).To(BeNil())
		sc := r.result["structuredContent"].(map[string]any)
		return sc["results"].([]any)[0].(map[string]any)["stdout"].(string)
	}

	BeforeAll(func(ctx SpecContext) {
		srv = startHTTP("--auth", "token", "--token-file", writeTokenFile(tokenA+" alice", tokenB+" bob"))
		DeferCleanup(func() { srv.stop() })
		r := rpc(ctx, tokenA, "tools/call", "sandbox_initialize", map[string]any{"name": "sandbox_initialize", "arguments": map[string]any{}}, false)
		Expect(r.err).To(BeNil())
		cid = r.result["structuredContent"].(map[string]any)["container_id"].(string)
	})

	It("advertises the extension in server/discover, under capabilities.extensions only", func(ctx SpecContext) {
		r := rpc(ctx, tokenA, "server/discover", "", nil, false)
		caps := r.result["capabilities"].(map[string]any)
		Expect(caps).To(HaveKeyWithValue("extensions", HaveKey(ext)))
		Expect(caps).NotTo(HaveKey("tasks"))
	})

	It("runs a background command as a task: created, polled, its result read from tasks/get", func(ctx SpecContext) {
		id := expectCreateTaskResult(exec(ctx, tokenA, map[string]any{"container_id": cid, "background": true,
			"commands": []string{"echo one; echo oops >&2; sleep 2; echo two; exit 3"}}, true))

		// Durable on creation: an immediate tasks/get resolves it.
		r := get(ctx, tokenA, id)
		Expect(r.err).To(BeNil())
		Expect(r.result).To(And(HaveKeyWithValue("resultType", "complete"), HaveKeyWithValue("taskId", id), HaveKeyWithValue("status", "working")))
		Expect(r.result).NotTo(Or(HaveKey("result"), HaveKey("error"), HaveKey("requestState")))

		// The task is the handle: the exec_* tools see it.
		handle := handleOf(r.result)
		l := rpc(ctx, tokenA, "tools/call", "exec_list", map[string]any{"name": "exec_list", "arguments": map[string]any{"container_id": cid}}, false)
		Expect(l.result["structuredContent"]).To(HaveKeyWithValue("processes", ContainElement(HaveKeyWithValue("handle", handle))))

		t := untilTerminal(ctx, id)
		// A tool error is completed with result.isError, never failed.
		Expect(t).To(HaveKeyWithValue("status", "completed"))
		Expect(t).NotTo(Or(HaveKey("error"), HaveKey("requestState")))
		res := t["result"].(map[string]any)
		Expect(res).To(HaveKeyWithValue("isError", true))
		Expect(res["content"]).To(ContainElement(HaveKeyWithValue("text", And(ContainSubstring("one\ntwo\n"), ContainSubstring("oops"), ContainSubstring("exit code 3")))))
		Expect(res["structuredContent"]).To(HaveKeyWithValue("results", ConsistOf(And(HaveKeyWithValue("exit_code", BeNumerically("==", 3)), HaveKeyWithValue("stdout", "one\ntwo\n"), HaveKeyWithValue("stderr", "oops\n")))))
		if meta, ok := res["_meta"].(map[string]any); ok {
			Expect(meta).NotTo(HaveKey("io.modelcontextprotocol/related-task"))
		}
		// Still there after it ended (its ttlMs runs to the sandbox's end).
		time.Sleep(500 * time.Millisecond)
		Expect(get(ctx, tokenA, id).result).To(HaveKeyWithValue("status", "completed"))
		// tasks/update: nothing is ever outstanding; it is acked.
		u := rpc(ctx, tokenA, "tasks/update", id, map[string]any{"taskId": id, "inputResponses": map[string]any{"k": map[string]any{}}}, true)
		Expect(u.result).To(Equal(map[string]any{"resultType": "complete"}))
	})

	It("makes a command still running at yield_after_seconds a task, and cancels it with its whole tree", func(ctx SpecContext) {
		start := time.Now()
		// With a progress token, so that the answer is an SSE stream (the
		// output streams as progress until the yield).
		created := rpc(ctx, tokenA, "tools/call", "sandbox_exec", map[string]any{"name": "sandbox_exec", "_meta": map[string]any{"progressToken": "yield"},
			"arguments": map[string]any{"container_id": cid, "yield_after_seconds": 1, "timeout_seconds": 300,
				"commands": []string{"echo started; sh -c 'sleep 101 & sleep 101' & sleep 101; echo never"}}}, true)
		Expect(created.sse).To(BeTrue(), "an SSE answer, rewritten on its way out")
		id := expectCreateTaskResult(created)
		Expect(time.Since(start)).To(BeNumerically("<", 10*time.Second))
		Expect(get(ctx, tokenA, id).result).To(HaveKeyWithValue("createdAt", created.result["createdAt"]), "one creation time")
		Eventually(func() string { return running(ctx, "sleep 101") }).WithTimeout(10 * time.Second).Should(Equal("n=3\n"))

		// Another identity can neither read nor cancel it.
		for _, r := range []rpcResult{get(ctx, tokenB, id), cancel(ctx, tokenB, id)} {
			Expect(r.status).To(Equal(http.StatusBadRequest))
			Expect(r.err).To(HaveKeyWithValue("code", BeNumerically("==", -32602)))
		}
		Expect(get(ctx, tokenA, id).result).To(HaveKeyWithValue("status", "working"))

		c := cancel(ctx, tokenA, id)
		Expect(c.err).To(BeNil())
		Expect(c.result).To(Equal(map[string]any{"resultType": "complete"}), "the ack carries no task envelope")
		t := untilTerminal(ctx, id)
		Expect(t).To(HaveKeyWithValue("status", "cancelled"))
		Expect(t).NotTo(Or(HaveKey("result"), HaveKey("error")))
		Eventually(func() string { return running(ctx, "sleep 101") }).WithTimeout(10 * time.Second).Should(Equal("n=0\n"))
		// Idempotent on a terminal task.
		Expect(cancel(ctx, tokenA, id).result).To(Equal(map[string]any{"resultType": "complete"}))
	})

	It("refuses forged and tampered task IDs and a mismatched Mcp-Name", func(ctx SpecContext) {
		id := expectCreateTaskResult(exec(ctx, tokenA, map[string]any{"container_id": cid, "background": true, "commands": []string{"sleep 30"}}, true))
		DeferCleanup(func(ctx SpecContext) { cancel(ctx, tokenA, id) })
		parts := strings.Split(id, ".")
		for _, bad := range []string{
			parts[0] + "." + parts[1] + "." + strings.Repeat("A", len(parts[2])),
			parts[0] + ".eyJjIjoieCIsImgiOiJwLTEifQ." + parts[2],
			"t1.garbage.garbage", "../../etc/passwd",
		} {
			r := get(ctx, tokenA, bad)
			Expect(r.status).To(Equal(http.StatusBadRequest), bad)
			Expect(r.err).To(HaveKeyWithValue("code", BeNumerically("==", -32602)), bad)
		}
		r := rpc(ctx, tokenA, "tasks/get", "another-task", map[string]any{"taskId": id}, true)
		Expect(r.status).To(Equal(http.StatusBadRequest))
		Expect(r.err).To(HaveKeyWithValue("code", BeNumerically("==", -32020)))
		// tasks/result and tasks/list are not part of the extension.
		for _, m := range []string{"tasks/result", "tasks/list"} {
			r := rpc(ctx, tokenA, m, "", map[string]any{"taskId": id}, true)
			Expect(r.err).To(HaveKeyWithValue("code", BeNumerically("==", -32601)), m)
		}
	})

	It("gives a client that did not declare the extension today's answers", func(ctx SpecContext) {
		r := exec(ctx, tokenA, map[string]any{"container_id": cid, "background": true, "commands": []string{"echo hi"}}, false)
		Expect(r.err).To(BeNil())
		Expect(r.result).To(HaveKeyWithValue("resultType", "complete"))
		Expect(r.result).NotTo(HaveKey("taskId"))
		Expect(r.result["structuredContent"]).To(HaveKeyWithValue("background", HaveKeyWithValue("handle", HavePrefix("p-"))))
		// A task method without the capability: -32021, naming it.
		g := rpc(ctx, tokenA, "tasks/get", "gate-test", map[string]any{"taskId": "gate-test"}, false)
		Expect(g.status).To(Equal(http.StatusBadRequest))
		Expect(g.err).To(HaveKeyWithValue("code", BeNumerically("==", -32021)))
		Expect(g.err).To(HaveKeyWithValue("data", HaveKeyWithValue("requiredCapabilities", HaveKeyWithValue("extensions", HaveKey(ext)))))
		// A short foreground command stays a plain result even when the
		// extension is declared.
		f := exec(ctx, tokenA, map[string]any{"container_id": cid, "commands": []string{"echo fast"}}, true)
		Expect(f.result).To(HaveKeyWithValue("resultType", "complete"))
		Expect(f.result).To(HaveKey("content"))
	})
})

var _ = Describe("the Tasks extension over stdio", Label("tasks"), func() {
	It("answers the task methods and rewrites the CreateTaskResult on the stdio transport too", func(ctx SpecContext) {
		cmd := osexec.Command(mcpBinary, baseArgs()...)
		cmd.SysProcAttr = procAttr()
		in, err := cmd.StdinPipe()
		Expect(err).NotTo(HaveOccurred())
		outPipe, err := cmd.StdoutPipe()
		Expect(err).NotTo(HaveOccurred())
		Expect(cmd.Start()).To(Succeed())
		DeferCleanup(func() { _ = in.Close(); _ = cmd.Wait() })
		out := bufio.NewScanner(outPipe)
		out.Buffer(make([]byte, 1<<20), 16<<20)
		next := 0
		meta := func(declare bool) map[string]any {
			caps := map[string]any{}
			if declare {
				caps["extensions"] = map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}}
			}
			return map[string]any{"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": caps}
		}
		rpc := func(method string, params map[string]any) map[string]any {
			next++
			b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": next, "method": method, "params": params})
			_, err := in.Write(append(b, '\n'))
			Expect(err).NotTo(HaveOccurred())
			for out.Scan() {
				var m map[string]any
				Expect(json.Unmarshal(out.Bytes(), &m)).To(Succeed(), out.Text())
				if id, ok := m["id"].(float64); ok && int(id) == next {
					return m
				}
			}
			Fail("the server closed stdout: " + fmt.Sprint(out.Err()))
			return nil
		}
		r := rpc("tools/call", map[string]any{"name": "sandbox_initialize", "arguments": map[string]any{}, "_meta": meta(false)})
		cid := r["result"].(map[string]any)["structuredContent"].(map[string]any)["container_id"].(string)
		r = rpc("tools/call", map[string]any{"name": "sandbox_exec", "_meta": meta(true),
			"arguments": map[string]any{"container_id": cid, "background": true, "commands": []string{"echo stdio-task"}}})
		created := r["result"].(map[string]any)
		Expect(created).To(And(HaveKeyWithValue("resultType", "task"), HaveKeyWithValue("status", "working")))
		Expect(created).NotTo(HaveKey("content"))
		id := created["taskId"].(string)
		Eventually(func() any {
			return rpc("tasks/get", map[string]any{"taskId": id, "_meta": meta(true)})["result"]
		}).WithTimeout(20 * time.Second).Should(And(HaveKeyWithValue("status", "completed"),
			HaveKeyWithValue("result", HaveKeyWithValue("content", ContainElement(HaveKeyWithValue("text", ContainSubstring("stdio-task\n")))))))
		Expect(rpc("tasks/get", map[string]any{"taskId": "nope", "_meta": meta(true)})["error"]).To(HaveKeyWithValue("code", BeNumerically("==", -32602)))
		Expect(rpc("tasks/cancel", map[string]any{"taskId": id, "_meta": meta(false)})["error"]).To(HaveKeyWithValue("code", BeNumerically("==", -32021)))
		// A request without the 2026-07-28 _meta is mcp-go's, as before.
		Expect(rpc("tasks/get", map[string]any{"taskId": id})["error"]).To(HaveKeyWithValue("code", BeNumerically("==", -32601)))
		rpc("tools/call", map[string]any{"name": "sandbox_stop", "arguments": map[string]any{"container_id": cid}, "_meta": meta(false)})
	})
})
