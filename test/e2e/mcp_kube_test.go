//go:build e2e

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/mcpclient"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// code-sandbox-mcp with --backend kubernetes, built from the tree, against
// the suite's control plane and a manager of its own that serves the node
// API on loopback; driven by the go-sdk MCP client over stdio and over HTTP
// with ServiceAccount tokens (--auth kubernetes). The server reaches the
// sandboxes only through the API server (the operator's aggregated API).
var _ = Describe("code-sandbox-mcp --backend kubernetes", Ordered, func() {
	const (
		// kmcpNode has its own manager (started like every node's,
		// system_test.go), so that these specs own its containers. The MCP
		// server pins its Sandboxes to it.
		kmcpNode      = "e2e-mcp-node"
		kmcpNamespace = "mcp-kube-e2e"
		kmcpManagedBy = "app.kubernetes.io/managed-by=code-sandbox-mcp"
	)
	var agent *managerProcess

	BeforeAll(func(ctx SpecContext) {
		Expect(removeContainersOf(ctx, kmcpNode)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			Expect(removeContainersOf(ctx, kmcpNode)).To(Succeed())
		}, NodeTimeout(time.Minute))

		By("starting a manager that serves the node API on loopback")
		var err error
		agent, err = startLoopbackNode(kmcpNode, filepath.Join(workDir, "mcp-node-state"))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() error { return agent.stop(15 * time.Second) })

		_, err = kubectl(ctx, "create", "namespace", kmcpNamespace)
		Expect(err).NotTo(HaveOccurred())
		// No wait: envtest runs no namespace controller, so the namespace
		// would never finish terminating; the specs delete their Sandboxes
		// themselves and check that none is left.
		DeferCleanup(func(ctx SpecContext) {
			_, _ = kubectl(ctx, "delete", "namespace", kmcpNamespace, "--ignore-not-found", "--wait=false")
		}, NodeTimeout(time.Minute))

		By("granting ServiceAccounts the shipped exec role and Sandbox lifecycle rights")
		_, err = kubectl(ctx, "create", "role", "sandbox-lifecycle", "-n", kmcpNamespace,
			"--verb=create,delete,get,list,watch", "--resource=sandboxes.sandbox.code-sandbox.dev")
		Expect(err).NotTo(HaveOccurred())
		for _, sa := range []string{"agent-a", "agent-b", "agent-noexec"} {
			_, err = kubectl(ctx, "create", "serviceaccount", sa, "-n", kmcpNamespace)
			Expect(err).NotTo(HaveOccurred())
			_, err = kubectl(ctx, "create", "rolebinding", sa+"-lifecycle", "-n", kmcpNamespace,
				"--role=sandbox-lifecycle", "--serviceaccount="+kmcpNamespace+":"+sa)
			Expect(err).NotTo(HaveOccurred())
		}
		for _, sa := range []string{"agent-a", "agent-b"} {
			_, err = kubectl(ctx, "create", "rolebinding", sa+"-exec", "-n", kmcpNamespace,
				"--clusterrole="+execRole, "--serviceaccount="+kmcpNamespace+":"+sa)
			Expect(err).NotTo(HaveOccurred())
		}
	}, NodeTimeout(5*time.Minute))

	JustBeforeEach(func() {
		Expect(agent.exitErr()).NotTo(HaveOccurred(), "the MCP node's manager exited")
	})

	serverArgs := func(extra ...string) []string {
		return append([]string{
			"--backend", "kubernetes", "--namespace", kmcpNamespace, "--kubeconfig", kubeconfig,
			"--node-name", kmcpNode, "--default-image", sampleImage, "--pull-policy", "Never",
			"--ready-timeout", "90s", "--log-level", "debug",
		}, extra...)
	}

	// sandboxExists reads the Sandbox through the API server.
	sandboxExists := func(ctx context.Context, name string) (bool, error) {
		out, err := kubectl(ctx, "get", "sandboxes", "-n", kmcpNamespace, "--ignore-not-found", "-o", "name", name)
		return strings.TrimSpace(out) != "", err
	}
	mcpSandboxes := func(ctx context.Context) (string, error) {
		return kubectl(ctx, "get", "sandboxes", "-n", kmcpNamespace, "-l", kmcpManagedBy, "-o", "name")
	}

	Describe("over stdio", Ordered, func() {
		var (
			sess   *mcp.ClientSession
			stderr *processLog
			mu     sync.Mutex
			notes  []*mcp.LoggingMessageParams
			id     string
		)

		BeforeAll(func(ctx SpecContext) {
			cmd := exec.Command(kmcpBin, serverArgs()...)
			stderr = &processLog{}
			cmd.Stderr = stderr
			cmd.SysProcAttr = managerProcAttr()
			client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, &mcp.ClientOptions{
				LoggingMessageHandler: func(_ context.Context, r *mcp.LoggingMessageRequest) {
					mu.Lock()
					notes = append(notes, r.Params)
					mu.Unlock()
				},
			})
			var err error
			sess, err = client.Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: time.Minute}, nil)
			Expect(err).NotTo(HaveOccurred(), "stderr:\n%s", stderr)
			DeferCleanup(func() { _ = sess.Close() })
		})

		It("creates a Ready Sandbox labelled for its owner", func(ctx SpecContext) {
			id = kmcpInit(ctx, sess, nil)
			Expect(id).To(HavePrefix("mcp-"))
			out, err := kubectl(ctx, "get", "sandbox", id, "-n", kmcpNamespace, "-o",
				`jsonpath={.status.conditions[?(@.type=="Ready")].status} {.metadata.labels.app\.kubernetes\.io/managed-by} {.metadata.labels.sandbox\.code-sandbox\.dev/mcp-owner} {.spec.nodeName}`)
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(Equal("True code-sandbox-mcp local " + kmcpNode))
		}, NodeTimeout(2*time.Minute))

		It("runs commands through the API server and streams their output", func(ctx SpecContext) {
			Expect(sess.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "info"})).To(Succeed())
			res, err := sess.CallTool(ctx, &mcp.CallToolParams{
				Name: "sandbox_exec",
				Arguments: map[string]any{"container_id": id, "commands": []string{
					"echo out; echo err >&2", "python3 -c 'print(6*7)'", "id -u",
				}},
				// Protocol 2026-07-28 asks for log messages per request.
				Meta: mcp.Meta{"io.modelcontextprotocol/logLevel": "info"},
			})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
			results := kmcpStructured(res)["results"].([]any)
			Expect(results).To(HaveLen(3))
			Expect(results[0]).To(And(HaveKeyWithValue("stdout", "out\n"), HaveKeyWithValue("stderr", "err\n")))
			Expect(results[1]).To(HaveKeyWithValue("stdout", "42\n"))
			Expect(results[2]).To(HaveKeyWithValue("stdout", "65534\n"))
			Eventually(func() []*mcp.LoggingMessageParams {
				mu.Lock()
				defer mu.Unlock()
				return notes
			}).Should(ContainElement(HaveField("Data", HaveKeyWithValue("text", "42\n"))))

			res = kmcpCall(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"exit 3", "echo never"}})
			Expect(res.IsError).To(BeTrue())
			Expect(kmcpText(res)).To(ContainSubstring("exit code 3"))
		}, NodeTimeout(2*time.Minute))

		It("writes and reads files, and shows output and history in the logs resource", func(ctx SpecContext) {
			res := kmcpCall(ctx, sess, "write_file", map[string]any{"container_id": id, "file_name": "main.py", "file_contents": "print('from a file')\n", "dest_dir": "/app/src"})
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
			res = kmcpCall(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"python3 /app/src/main.py"}})
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
			Expect(kmcpText(res)).To(ContainSubstring("from a file"))

			res = kmcpCall(ctx, sess, "read_file", map[string]any{"container_id": id, "path": "src/main.py"})
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
			Expect(kmcpStructured(res)).To(HaveKeyWithValue("content", "print('from a file')\n"))
			res = kmcpCall(ctx, sess, "read_file", map[string]any{"container_id": id, "path": "/app/nope.txt"})
			Expect(res.IsError).To(BeTrue())
			Expect(kmcpText(res)).To(And(ContainSubstring("path not found"), ContainSubstring("nope.txt")))
			Expect(kmcpText(res)).NotTo(ContainSubstring("belongs to another client"), "a missing file was reported as a missing sandbox")

			logs, err := sess.ReadResource(ctx, &mcp.ReadResourceParams{URI: "containers://" + id + "/logs"})
			Expect(err).NotTo(HaveOccurred())
			Expect(logs.Contents).To(HaveLen(1))
			Expect(logs.Contents[0].Text).To(And(ContainSubstring("== exec history =="), ContainSubstring("python3 /app/src/main.py"), ContainSubstring("exit=3")))
		}, NodeTimeout(2*time.Minute))

		It("resumes a Sandbox paused through the API (spec.paused) before the next command", func(ctx SpecContext) {
			_, err := kubectl(ctx, "patch", "sandbox", id, "-n", kmcpNamespace, "--type", "merge", "-p", `{"spec":{"paused":true}}`)
			Expect(err).NotTo(HaveOccurred())
			Eventually(func() (string, error) {
				return kubectl(ctx, "get", "sandbox", id, "-n", kmcpNamespace, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].reason}`)
			}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Equal("Paused"))
			res := kmcpCall(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"cat /app/src/main.py"}})
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
			Expect(kmcpText(res)).To(ContainSubstring("from a file"))
			out, err := kubectl(ctx, "get", "sandbox", id, "-n", kmcpNamespace, "-o",
				`jsonpath={.spec.paused} {.status.conditions[?(@.type=="Ready")].reason} {.status.conditions[?(@.type=="Paused")].reason}`)
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(Equal("false Running Resumed"))
		}, NodeTimeout(2*time.Minute))

		It("lists the sandbox and deletes the Sandbox on sandbox_stop", func(ctx SpecContext) {
			res := kmcpCall(ctx, sess, "list_sandboxes", nil)
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
			Expect(kmcpText(res)).To(And(ContainSubstring(id), ContainSubstring("status=running")))

			res = kmcpCall(ctx, sess, "sandbox_stop", map[string]any{"container_id": id})
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
			Expect(sandboxExists(ctx, id)).To(BeFalse(), "sandbox_stop returned before the Sandbox was gone")

			res = kmcpCall(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"true"}})
			Expect(res.IsError).To(BeTrue())
			Expect(kmcpText(res)).To(ContainSubstring("not found"))
		}, NodeTimeout(2*time.Minute))

		It("reports a failed start with its reason and deletes the Sandbox", func(ctx SpecContext) {
			res := kmcpCall(ctx, sess, "sandbox_initialize", map[string]any{"image": "code-sandbox-test/does-not-exist:1"})
			Expect(res.IsError).To(BeTrue())
			Expect(kmcpText(res)).To(ContainSubstring("ImageNotFound"))
			Eventually(mcpSandboxes).WithContext(ctx).WithTimeout(time.Minute).Should(BeEmpty())
		}, NodeTimeout(2*time.Minute))

		It("leaves its Sandboxes when the server exits: another replica, or the next run, serves them", func(ctx SpecContext) {
			other := kmcpInit(ctx, sess, nil)
			Expect(sandboxExists(ctx, other)).To(BeTrue())
			Expect(sess.Close()).To(Succeed())
			Consistently(func() (bool, error) { return sandboxExists(ctx, other) }).WithTimeout(5*time.Second).Should(BeTrue(),
				"the exiting server deleted a Sandbox (spec.lifecycle and activeDeadlineSeconds end it, not the server)")
			_, err := kubectl(ctx, "delete", "sandbox", "-n", kmcpNamespace, "--wait=true", "--timeout=60s", other)
			Expect(err).NotTo(HaveOccurred())
		}, NodeTimeout(3*time.Minute))
	})

	Describe("over HTTP with --auth kubernetes", Ordered, func() {
		var (
			url    string
			tokens = map[string]string{}
		)

		BeforeAll(func(ctx SpecContext) {
			for _, sa := range []string{"agent-a", "agent-b", "agent-noexec"} {
				out, err := kubectl(ctx, "create", "token", sa, "-n", kmcpNamespace, "--duration=1h", "--audience", "code-sandbox-mcp")
				Expect(err).NotTo(HaveOccurred())
				tokens[sa] = strings.TrimSpace(out)
			}
			// Registered first, so it runs after the server has stopped:
			// Close deleted what the server created.
			DeferCleanup(func(ctx SpecContext) {
				Expect(mcpSandboxes(ctx)).To(BeEmpty())
			}, NodeTimeout(time.Minute))
			url, _ = startKubeMCPHTTP(serverArgs("--http", "127.0.0.1:0", "--auth", "kubernetes")...)
		})

		connect := func(ctx context.Context, sa string, opts *mcp.ClientOptions) *mcp.ClientSession {
			return connectKubeMCP(ctx, url, tokens[sa], "e2e-"+sa, opts)
		}

		It("refuses a token the API server does not accept", func(ctx SpecContext) {
			client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
			hc := &http.Client{Transport: mcpclient.Bearer{Token: "not-a-kubernetes-token-at-all", Base: http.DefaultTransport}}
			_, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1}, nil)
			Expect(err).To(HaveOccurred())
		})

		It("lets a permitted ServiceAccount use a sandbox end to end", func(ctx SpecContext) {
			var (
				mu       sync.Mutex
				progress []string
			)
			sess := connect(ctx, "agent-a", &mcp.ClientOptions{
				ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
					mu.Lock()
					progress = append(progress, r.Params.Message)
					mu.Unlock()
				},
			})
			id := kmcpInit(ctx, sess, nil)
			out, err := kubectl(ctx, "get", "sandbox", id, "-n", kmcpNamespace, "-o", `jsonpath={.metadata.annotations.sandbox\.code-sandbox\.dev/mcp-identity}`)
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(Equal("kube:system:serviceaccount:" + kmcpNamespace + ":agent-a"))

			done := make(chan *mcp.CallToolResult, 1)
			go func() {
				defer GinkgoRecover()
				res, err := sess.CallTool(ctx, &mcp.CallToolParams{
					Name:      "sandbox_exec",
					Arguments: map[string]any{"container_id": id, "commands": []string{"echo first; sleep 3; echo second"}},
					Meta:      mcp.Meta{"progressToken": "tok-k"},
				})
				Expect(err).NotTo(HaveOccurred())
				done <- res
			}()
			Eventually(func() string {
				mu.Lock()
				defer mu.Unlock()
				return strings.Join(progress, "")
			}).WithTimeout(2500 * time.Millisecond).Should(ContainSubstring("first"))
			Consistently(done).WithTimeout(300 * time.Millisecond).ShouldNot(Receive())
			var res *mcp.CallToolResult
			Eventually(done).WithTimeout(30 * time.Second).Should(Receive(&res))
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
			Expect(kmcpText(res)).To(ContainSubstring("second"))

			res = kmcpCall(ctx, sess, "write_file", map[string]any{"container_id": id, "file_name": "note.txt", "file_contents": "a note\n"})
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
			res = kmcpCall(ctx, sess, "read_file", map[string]any{"container_id": id, "path": "/app/note.txt"})
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
			Expect(kmcpStructured(res)).To(HaveKeyWithValue("content", "a note\n"))

			logs, err := sess.ReadResource(ctx, &mcp.ReadResourceParams{URI: "containers://" + id + "/logs"})
			Expect(err).NotTo(HaveOccurred())
			Expect(logs.Contents[0].Text).To(ContainSubstring("echo first; sleep 3; echo second"))

			res = kmcpCall(ctx, sess, "sandbox_stop", map[string]any{"container_id": id})
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
			Expect(sandboxExists(ctx, id)).To(BeFalse())
		}, NodeTimeout(3*time.Minute))

		It("lets any replica answer for a background command's handle (issue 26)", func(ctx SpecContext) {
			// Two replicas of the server, each its own instance, sharing
			// the owner key as replicas do: the handle and the output live
			// in the sandbox, not in either.
			key := filepath.Join(GinkgoT().TempDir(), "owner.key")
			Expect(os.WriteFile(key, []byte(strings.Repeat("k", 32)), 0o600)).To(Succeed())
			urlA, _ := startKubeMCPHTTP(serverArgs("--http", "127.0.0.1:0", "--auth", "kubernetes", "--owner-key-file", key)...)
			urlB, _ := startKubeMCPHTTP(serverArgs("--http", "127.0.0.1:0", "--auth", "kubernetes", "--owner-key-file", key)...)
			a := connectKubeMCP(ctx, urlA, tokens["agent-a"], "e2e-agent-a", nil)
			b := connectKubeMCP(ctx, urlB, tokens["agent-a"], "e2e-agent-a-b", nil)
			id := kmcpInit(ctx, a, nil)
			res := kmcpCall(ctx, a, "sandbox_exec", map[string]any{"container_id": id, "yield_after_seconds": 1, "timeout_seconds": 120,
				"commands": []string{"echo one; sleep 4; echo two; exit 6"}})
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
			bg := kmcpStructured(res)["background"].(map[string]any)
			Expect(bg["state"]).To(Equal("running"))
			handle := bg["handle"].(string)

			res = kmcpCall(ctx, b, "exec_wait", map[string]any{"container_id": id, "handle": handle, "timeout_seconds": 30})
			Expect(kmcpText(res)).To(ContainSubstring("exited with code 6"))
			Expect(kmcpStructured(res)["stdout"]).To(Equal("one\ntwo\n"))
			res = kmcpCall(ctx, b, "exec_list", map[string]any{"container_id": id})
			Expect(kmcpText(res)).To(ContainSubstring(handle))
			// Another identity sees neither the sandbox nor its handle.
			other := connectKubeMCP(ctx, urlB, tokens["agent-b"], "e2e-agent-b", nil)
			res = kmcpCall(ctx, other, "exec_poll", map[string]any{"container_id": id, "handle": handle})
			Expect(res.IsError).To(BeTrue())
			Expect(kmcpText(res)).To(ContainSubstring("not found"))
			res = kmcpCall(ctx, a, "sandbox_stop", map[string]any{"container_id": id})
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
		}, NodeTimeout(3*time.Minute))

		It("lets any replica answer a task of the Tasks extension, and no other identity or owner key (issue 26)", func(ctx SpecContext) {
			key := filepath.Join(GinkgoT().TempDir(), "owner.key")
			Expect(os.WriteFile(key, []byte(strings.Repeat("k", 32)), 0o600)).To(Succeed())
			otherKey := filepath.Join(GinkgoT().TempDir(), "other.key")
			Expect(os.WriteFile(otherKey, []byte(strings.Repeat("o", 32)), 0o600)).To(Succeed())
			urlA, _ := startKubeMCPHTTP(serverArgs("--http", "127.0.0.1:0", "--auth", "kubernetes", "--owner-key-file", key)...)
			urlB, _ := startKubeMCPHTTP(serverArgs("--http", "127.0.0.1:0", "--auth", "kubernetes", "--owner-key-file", key)...)
			urlC, _ := startKubeMCPHTTP(serverArgs("--http", "127.0.0.1:0", "--auth", "kubernetes", "--owner-key-file", otherKey)...)
			// rpc speaks MCP 2026-07-28 on the wire, declaring the extension
			// (no client library implements it).
			rpc := func(url, token, method, name string, params map[string]any) (map[string]any, map[string]any) {
				params["_meta"] = map[string]any{"io.modelcontextprotocol/protocolVersion": "2026-07-28",
					"io.modelcontextprotocol/clientCapabilities": map[string]any{"extensions": map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}}}}
				body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
				Expect(err).NotTo(HaveOccurred())
				for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
					"Authorization": "Bearer " + token, "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method, "Mcp-Name": name} {
					req.Header.Set(k, v)
				}
				resp, err := http.DefaultClient.Do(req)
				Expect(err).NotTo(HaveOccurred())
				defer resp.Body.Close()
				raw, err := io.ReadAll(resp.Body)
				Expect(err).NotTo(HaveOccurred())
				msg := raw
				for _, line := range strings.Split(string(raw), "\n") {
					if data, ok := strings.CutPrefix(line, "data: "); ok && strings.Contains(data, `"id"`) {
						msg = []byte(data)
					}
				}
				var out struct {
					Result map[string]any `json:"result"`
					Error  map[string]any `json:"error"`
				}
				Expect(json.Unmarshal(msg, &out)).To(Succeed(), "%s", raw)
				return out.Result, out.Error
			}
			a := connectKubeMCP(ctx, urlA, tokens["agent-a"], "e2e-agent-a", nil)
			id := kmcpInit(ctx, a, nil)
			res, rpcErr := rpc(urlA, tokens["agent-a"], "tools/call", "sandbox_exec", map[string]any{"name": "sandbox_exec",
				"arguments": map[string]any{"container_id": id, "background": true, "commands": []string{"echo one; sleep 3; echo two; exit 6"}}})
			Expect(rpcErr).To(BeNil())
			Expect(res).To(HaveKeyWithValue("resultType", "task"))
			task := res["taskId"].(string)

			// Replica B, which never saw the task, follows it to its end.
			var got map[string]any
			Eventually(func() any {
				got, rpcErr = rpc(urlB, tokens["agent-a"], "tasks/get", task, map[string]any{"taskId": task})
				Expect(rpcErr).To(BeNil())
				return got["status"]
			}).WithTimeout(60 * time.Second).WithPolling(500 * time.Millisecond).Should(Equal("completed"))
			Expect(got["result"]).To(HaveKeyWithValue("structuredContent", HaveKeyWithValue("results",
				ConsistOf(And(HaveKeyWithValue("exit_code", BeNumerically("==", 6)), HaveKeyWithValue("stdout", "one\ntwo\n"))))))
			// Another ServiceAccount, and a replica with another owner key,
			// know no such task.
			for _, c := range []struct{ url, token string }{{urlB, tokens["agent-b"]}, {urlC, tokens["agent-a"]}} {
				_, rpcErr = rpc(c.url, c.token, "tasks/get", task, map[string]any{"taskId": task})
				Expect(rpcErr).To(HaveKeyWithValue("code", BeNumerically("==", -32602)))
				_, rpcErr = rpc(c.url, c.token, "tasks/cancel", task, map[string]any{"taskId": task})
				Expect(rpcErr).To(HaveKeyWithValue("code", BeNumerically("==", -32602)))
			}
			r := kmcpCall(ctx, a, "sandbox_stop", map[string]any{"container_id": id})
			Expect(r.IsError).To(BeFalse(), kmcpText(r))
			// Its sandbox gone, the task is unknown too.
			_, rpcErr = rpc(urlB, tokens["agent-a"], "tasks/get", task, map[string]any{"taskId": task})
			Expect(rpcErr).To(HaveKeyWithValue("code", BeNumerically("==", -32602)))
		}, NodeTimeout(3*time.Minute))

		It("tells a ServiceAccount without exec rights which permission it lacks", func(ctx SpecContext) {
			sess := connect(ctx, "agent-noexec", nil)
			id := kmcpInit(ctx, sess, nil)
			res := kmcpCall(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"echo hi"}})
			Expect(res.IsError).To(BeTrue())
			Expect(kmcpText(res)).To(ContainSubstring(fmt.Sprintf(
				`user "system:serviceaccount:%s:agent-noexec" may not create sandboxes/exec (sandbox %s) in namespace %q`, kmcpNamespace, id, kmcpNamespace)))
			res = kmcpCall(ctx, sess, "read_file", map[string]any{"container_id": id, "path": "x"})
			Expect(res.IsError).To(BeTrue())
			Expect(kmcpText(res)).To(ContainSubstring("may not get sandboxes/files"))
			res = kmcpCall(ctx, sess, "sandbox_stop", map[string]any{"container_id": id})
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
		}, NodeTimeout(3*time.Minute))

		It("hides one ServiceAccount's sandboxes from another", func(ctx SpecContext) {
			a := connect(ctx, "agent-a", nil)
			b := connect(ctx, "agent-b", nil)
			id := kmcpInit(ctx, a, nil)

			res := kmcpCall(ctx, b, "list_sandboxes", nil)
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
			Expect(kmcpText(res)).NotTo(ContainSubstring(id))
			for _, tc := range []struct {
				tool string
				args map[string]any
			}{
				{"sandbox_exec", map[string]any{"container_id": id, "commands": []string{"true"}}},
				{"read_file", map[string]any{"container_id": id, "path": "x"}},
				{"sandbox_stop", map[string]any{"container_id": id}},
			} {
				res := kmcpCall(ctx, b, tc.tool, tc.args)
				Expect(res.IsError).To(BeTrue(), tc.tool)
				Expect(kmcpText(res)).To(ContainSubstring("not found"), tc.tool)
			}
			_, err := b.ReadResource(ctx, &mcp.ReadResourceParams{URI: "containers://" + id + "/logs"})
			Expect(err).To(HaveOccurred())
			Expect(sandboxExists(ctx, id)).To(BeTrue())

			res = kmcpCall(ctx, a, "list_sandboxes", nil)
			Expect(kmcpText(res)).To(ContainSubstring(id))
			res = kmcpCall(ctx, a, "sandbox_stop", map[string]any{"container_id": id})
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
		}, NodeTimeout(3*time.Minute))
	})

	Describe("preview URLs on two replicas (--preview-addr)", Ordered, func() {
		var (
			token            string
			mcpA, mcpB       string
			previewA         string
			previewB         string
			sessA, sessB     *mcp.ClientSession
			id               string
			previewAddrOf    = regexp.MustCompile(`msg="serving previews" addr=(\S+)`)
			previewURLPrefix = regexp.MustCompile(`^http://[^/]+/preview/`)
		)
		// onReplica is u (a preview URL handed out by either replica) sent
		// to the replica whose preview listener is addr.
		onReplica := func(u, addr string) string {
			return previewURLPrefix.ReplaceAllString(u, "http://"+addr+"/preview/")
		}
		expose := func(ctx context.Context, s *mcp.ClientSession, port int) string {
			GinkgoHelper()
			res := kmcpCall(ctx, s, "expose_port", map[string]any{"container_id": id, "port": port})
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
			u, _ := kmcpStructured(res)["url"].(string)
			Expect(u).To(MatchRegexp(`^http://127\.0\.0\.1:\d+/preview/v1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+/$`))
			return u
		}

		BeforeAll(func(ctx SpecContext) {
			out, err := kubectl(ctx, "create", "token", "agent-a", "-n", kmcpNamespace, "--duration=1h", "--audience", "code-sandbox-mcp")
			Expect(err).NotTo(HaveOccurred())
			token = strings.TrimSpace(out)
			// Two replicas: two processes sharing the owner key, as a
			// Deployment's pods share its Secret.
			key := filepath.Join(GinkgoT().TempDir(), "owner.key")
			Expect(os.WriteFile(key, []byte("0123456789abcdef0123456789abcdef"), 0o600)).To(Succeed())
			DeferCleanup(func(ctx SpecContext) {
				Expect(mcpSandboxes(ctx)).To(BeEmpty())
			}, NodeTimeout(time.Minute))
			var logA, logB *processLog
			mcpA, logA = startKubeMCPHTTP(serverArgs("--http", "127.0.0.1:0", "--auth", "kubernetes", "--owner-key-file", key, "--preview-addr", "127.0.0.1:0")...)
			mcpB, logB = startKubeMCPHTTP(serverArgs("--http", "127.0.0.1:0", "--auth", "kubernetes", "--owner-key-file", key, "--preview-addr", "127.0.0.1:0")...)
			previewA = previewAddrOf.FindStringSubmatch(logA.String())[1]
			previewB = previewAddrOf.FindStringSubmatch(logB.String())[1]
			sessA = connectKubeMCP(ctx, mcpA, token, "e2e-preview-a", nil)
			sessB = connectKubeMCP(ctx, mcpB, token, "e2e-preview-b", nil)
			id = kmcpInit(ctx, sessA, nil)
			for name, body := range map[string]string{"index.html": "<h1>kube preview</h1>\n", "ws.py": wsEchoServer} {
				res := kmcpCall(ctx, sessA, "write_file", map[string]any{"container_id": id, "file_name": name, "file_contents": body, "dest_dir": "/tmp/site"})
				Expect(res.IsError).To(BeFalse(), kmcpText(res))
			}
			res := kmcpCall(ctx, sessA, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{`cd /tmp/site && (nohup python3 -m http.server 8000 --bind 127.0.0.1 >/tmp/http.log 2>&1 &) && (nohup python3 /tmp/site/ws.py 8001 >/tmp/ws.log 2>&1 &) && python3 -c '
import socket, time
for p in (8000, 8001):
    for i in range(100):
        try: socket.create_connection(("127.0.0.1", p)).close(); break
        except OSError: time.sleep(0.1)
    else: raise SystemExit("port %d never listened" % p)'`}})
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
			Expect(kmcpText(res)).To(ContainSubstring("[exit code 0,"), "the servers in the sandbox did not start")
		}, NodeTimeout(3*time.Minute))

		It("serves through B a URL exposed through A, HTTP and WebSocket, and refuses a tampered one", func(ctx SpecContext) {
			u := expose(ctx, sessA, 8000)
			Expect(u).To(HavePrefix("http://" + previewA + "/preview/"))
			out, err := kubectl(ctx, "get", "sandbox", id, "-n", kmcpNamespace, "-o", `jsonpath={.metadata.annotations.sandbox\.code-sandbox\.dev/mcp-exposures}`)
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(ContainSubstring(`"8000":{"nonce":`))
			for _, addr := range []string{previewB, previewA} {
				code, body := previewGet(ctx, onReplica(u, addr), nil)
				Expect(code).To(Equal(http.StatusOK), "through %s: %s", addr, body)
				Expect(body).To(ContainSubstring("<h1>kube preview</h1>"))
			}
			ws := expose(ctx, sessA, 8001)
			answer, err := wsEcho(onReplica(ws, previewB)+"ws", "ping through the API server")
			Expect(err).NotTo(HaveOccurred())
			Expect(answer).To(Equal("echo:ping through the API server"))

			tampered := []byte(u)
			i := len(tampered) - 3
			tampered[i] = map[bool]byte{true: 'B', false: 'A'}[tampered[i] == 'A']
			code, body := previewGet(ctx, onReplica(string(tampered), previewB), nil)
			Expect(code).To(Equal(http.StatusForbidden), body)
			Expect(body).NotTo(ContainSubstring("kube preview"))

			// Exposing needs the caller's own right to forward the port: a
			// ServiceAccount without sandboxes/portforward gets no URL.
			out, err = kubectl(ctx, "create", "token", "agent-noexec", "-n", kmcpNamespace, "--duration=1h", "--audience", "code-sandbox-mcp")
			Expect(err).NotTo(HaveOccurred())
			noexec := connectKubeMCP(ctx, mcpB, strings.TrimSpace(out), "e2e-preview-noexec", nil)
			own := kmcpInit(ctx, noexec, nil)
			res := kmcpCall(ctx, noexec, "expose_port", map[string]any{"container_id": own, "port": 8000})
			Expect(res.IsError).To(BeTrue(), kmcpText(res))
			Expect(kmcpText(res)).To(ContainSubstring("sandboxes/portforward"))
			// Nor may it expose another identity's sandbox.
			res = kmcpCall(ctx, noexec, "expose_port", map[string]any{"container_id": id, "port": 8000})
			Expect(res.IsError).To(BeTrue(), kmcpText(res))
			res = kmcpCall(ctx, noexec, "sandbox_stop", map[string]any{"container_id": own})
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
		}, NodeTimeout(2*time.Minute))

		It("revokes on every replica: unexpose through B is refused through A, and the sandbox's end ends its URLs", func(ctx SpecContext) {
			u := expose(ctx, sessA, 8000)
			code, _ := previewGet(ctx, onReplica(u, previewA), nil)
			Expect(code).To(Equal(http.StatusOK))
			res := kmcpCall(ctx, sessB, "unexpose_port", map[string]any{"container_id": id, "port": 8000})
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
			Expect(kmcpStructured(res)).To(HaveKeyWithValue("revoked", true))
			Eventually(func() int {
				code, _ := previewGet(ctx, onReplica(u, previewA), nil)
				return code
			}).WithTimeout(5*time.Second).Should(Equal(http.StatusForbidden), "replica A still serves a URL revoked through B")

			// Re-exposing through B retires A's newer URL too.
			u2 := expose(ctx, sessA, 8000)
			u3 := expose(ctx, sessB, 8000)
			Eventually(func() int {
				code, _ := previewGet(ctx, onReplica(u2, previewA), nil)
				return code
			}).WithTimeout(5 * time.Second).Should(Equal(http.StatusForbidden))
			code, _ = previewGet(ctx, onReplica(u3, previewA), nil)
			Expect(code).To(Equal(http.StatusOK))

			res = kmcpCall(ctx, sessB, "sandbox_stop", map[string]any{"container_id": id})
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
			Eventually(func() int {
				code, _ := previewGet(ctx, onReplica(u3, previewA), nil)
				return code
			}).WithTimeout(10 * time.Second).Should(Equal(http.StatusNotFound))
		}, NodeTimeout(2*time.Minute))
	})

	Describe("with --warm-pool", Ordered, func() {
		var sess *mcp.ClientSession

		BeforeAll(func(ctx SpecContext) {
			By("creating a SandboxWarmPool of one and waiting for its member to be idle")
			pool := filepath.Join(workDir, "mcp-warm-pool.yaml")
			Expect(os.WriteFile(pool, []byte(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: SandboxWarmPool
metadata:
  name: mcp-pool
  namespace: `+kmcpNamespace+`
spec:
  replicas: 1
  template:
    image: `+sampleImage+`
    imagePullPolicy: Never
`), 0o600)).To(Succeed())
			_, err := kubectl(ctx, "apply", "-f", pool)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(func(ctx SpecContext) {
				_, _ = kubectl(ctx, "delete", "-f", pool, "--ignore-not-found")
			}, NodeTimeout(time.Minute))
			Eventually(func() (string, error) {
				return kubectl(ctx, "get", "swp", "mcp-pool", "-n", kmcpNamespace, "-o", "jsonpath={.status.readyReplicas}")
			}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Equal("1"))

			// Not pinned to the MCP node: the member may sit on any node.
			args := []string{"--backend", "kubernetes", "--namespace", kmcpNamespace, "--kubeconfig", kubeconfig,
				"--default-image", sampleImage, "--ready-timeout", "90s", "--warm-pool", "mcp-pool"}
			cmd := exec.Command(kmcpBin, args...)
			stderr := &processLog{}
			cmd.Stderr = stderr
			cmd.SysProcAttr = managerProcAttr()
			client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
			sess, err = client.Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: time.Minute}, nil)
			Expect(err).NotTo(HaveOccurred(), "stderr:\n%s", stderr)
			DeferCleanup(func() { _ = sess.Close() })
		}, NodeTimeout(4*time.Minute))

		It("claims a default sandbox_initialize from the pool and runs commands in it", func(ctx SpecContext) {
			id := kmcpInit(ctx, sess, nil)
			out, err := kubectl(ctx, "get", "sandbox", id, "-n", kmcpNamespace, "-o",
				`jsonpath={.spec.warmPoolRef.name} {.status.conditions[?(@.type=="WarmPoolClaim")].reason} {.status.conditions[?(@.type=="Ready")].status}`)
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(Equal("mcp-pool WarmPoolClaimed True"), func() string {
				// Which node held the idle member, and which claimed.
				nodes, _ := kubectl(ctx, "get", "sandboxes", "-n", kmcpNamespace, "-o",
					`jsonpath={range .items[*]}{.metadata.name} node={.status.nodeName} {.status.conditions[?(@.type=="WarmPoolClaim")].message}{"\n"}{end}`)
				return nodes
			})
			res := kmcpCall(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"python3 -c 'print(6*7)'", "ls -A /app /tmp"}})
			Expect(res.IsError).To(BeFalse(), kmcpText(res))
			results := kmcpStructured(res)["results"].([]any)
			Expect(results[0]).To(HaveKeyWithValue("stdout", "42\n"))
			Expect(results[1]).To(HaveKeyWithValue("stdout", "/app:\n\n/tmp:\n"))

			By("a request with other settings is created as usual")
			other := kmcpInit(ctx, sess, map[string]any{"memory": "256Mi"})
			out, err = kubectl(ctx, "get", "sandbox", other, "-n", kmcpNamespace, "-o", "jsonpath={.spec.warmPoolRef}{.spec.image}")
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(Equal(sampleImage))
		}, NodeTimeout(3*time.Minute))
	})
})

// startKubeMCPHTTP starts code-sandbox-mcp with args (which must serve
// over --http) and returns its URL and stderr. It is stopped with SIGTERM,
// which deletes its Sandboxes, when the calling node ends.
func startKubeMCPHTTP(args ...string) (string, *processLog) {
	GinkgoHelper()
	cmd := exec.Command(kmcpBin, args...)
	stderr := &processLog{}
	cmd.Stderr = stderr
	cmd.SysProcAttr = managerProcAttr()
	Expect(cmd.Start()).To(Succeed())
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	DeferCleanup(func(ctx SpecContext) {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		Eventually(waited).WithContext(ctx).WithTimeout(time.Minute).Should(Receive())
	}, NodeTimeout(2*time.Minute))
	urlRE := regexp.MustCompile(`msg="serving MCP over streamable HTTP" url=(\S+)`)
	Eventually(func() string {
		if m := urlRE.FindStringSubmatch(stderr.String()); m != nil {
			return m[1]
		}
		return ""
	}).WithTimeout(30*time.Second).ShouldNot(BeEmpty(), "server did not start:\n%s", stderr)
	return urlRE.FindStringSubmatch(stderr.String())[1], stderr
}

// connectKubeMCP opens a session to url with a bearer token; it is closed
// when the calling node ends.
func connectKubeMCP(ctx context.Context, url, token, clientName string, opts *mcp.ClientOptions) *mcp.ClientSession {
	GinkgoHelper()
	client := mcp.NewClient(&mcp.Implementation{Name: clientName, Version: "1"}, opts)
	hc := &http.Client{Transport: mcpclient.Bearer{Token: token, Base: http.DefaultTransport}}
	sess, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1}, nil)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { _ = sess.Close() })
	return sess
}

// processLog collects a process's output (a server's stderr, a manager's
// log) for assertions while it runs, and copies it to GinkgoWriter.
type processLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *processLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = GinkgoWriter.Write(p)
	return l.buf.Write(p)
}

func (l *processLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// The MCP client helpers the suites share (internal/testenv/mcpclient).
var (
	kmcpCall       = mcpclient.Call
	kmcpText       = mcpclient.Text
	kmcpStructured = mcpclient.Structured
	// kmcpInit creates a sandbox and returns its ID.
	kmcpInit = mcpclient.Initialize
)
