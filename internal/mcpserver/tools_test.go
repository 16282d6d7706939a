package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/mark3labs/mcp-go/server"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// toolHarness is an MCP server on a fakeBackend, with one allowed host
// directory, driven through JSON-RPC as a client drives it.
type toolHarness struct {
	fake *fakeBackend
	srv  *server.MCPServer
	host string // the allowed host directory
}

func newToolHarness(cfg Config) *toolHarness {
	GinkgoHelper()
	h := &toolHarness{fake: newFakeBackend()}
	dir, err := filepath.EvalSymlinks(GinkgoT().TempDir())
	Expect(err).NotTo(HaveOccurred())
	h.host = dir
	if cfg.HostRoots == nil {
		cfg.HostRoots, err = NewHostRoots([]string{dir})
		Expect(err).NotTo(HaveOccurred())
	}
	h.srv, err = New(cfg, h.fake, slog.New(slog.DiscardHandler))
	Expect(err).NotTo(HaveOccurred())
	return h
}

// toolResult is a tools/call result as a client sees it.
type toolResult struct {
	IsError    bool
	Text       string
	Structured json.RawMessage
}

// into decodes the structured content.
func (r toolResult) into(v any) {
	GinkgoHelper()
	Expect(r.Structured).NotTo(BeEmpty(), "no structured content in %q", r.Text)
	Expect(json.Unmarshal(r.Structured, v)).To(Succeed())
}

// call calls tool as caller with args (a JSON object, or "" for none).
func (h *toolHarness) call(caller, tool, args string) toolResult {
	GinkgoHelper()
	params := fmt.Sprintf(`{"name":%q}`, tool)
	if args != "" {
		params = fmt.Sprintf(`{"name":%q,"arguments":%s}`, tool, args)
	}
	var res struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		StructuredContent json.RawMessage `json:"structuredContent"`
		IsError           bool            `json:"isError"`
	}
	Expect(json.Unmarshal(rpc(h.srv, caller, "tools/call", params), &res)).To(Succeed())
	Expect(res.Content).NotTo(BeEmpty())
	return toolResult{IsError: res.IsError, Text: res.Content[0].Text, Structured: res.StructuredContent}
}

// readLogs reads containers://{id}/logs as caller; err is the JSON-RPC
// error's message.
func (h *toolHarness) readLogs(caller, id string) (text string, errMsg string) {
	GinkgoHelper()
	ctx := contract.WithCaller(context.Background(), contract.Caller{ID: caller})
	msg := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"containers://%s/logs"}}`, id)
	raw, err := json.Marshal(h.srv.HandleMessage(ctx, json.RawMessage(msg)))
	Expect(err).NotTo(HaveOccurred())
	var resp struct {
		Result struct {
			Contents []struct {
				Text string `json:"text"`
			} `json:"contents"`
		} `json:"result"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	Expect(json.Unmarshal(raw, &resp)).To(Succeed())
	if resp.Error != nil {
		return "", resp.Error.Message
	}
	Expect(resp.Result.Contents).To(HaveLen(1))
	return resp.Result.Contents[0].Text, ""
}

func jsonArgs(m map[string]any) string {
	b, err := json.Marshal(m)
	Expect(err).NotTo(HaveOccurred())
	return string(b)
}

// sandboxToolNames are the tools that act on one sandbox.
var sandboxToolNames = []string{"sandbox_exec", "write_file", "read_file", "copy_project", "copy_file", "copy_file_from_sandbox", "sandbox_metrics", "sandbox_stop"}

// allToolNames are all nine tools.
var allToolNames = append([]string{"sandbox_initialize", "list_sandboxes"}, sandboxToolNames...)

// validArgs are arguments with which tool succeeds on sandbox id, after
// h.prepare(id).
func (h *toolHarness) validArgs(tool, id string) map[string]any {
	switch tool {
	case "sandbox_initialize", "list_sandboxes":
		return map[string]any{}
	case "sandbox_exec":
		return map[string]any{"container_id": id, "commands": []string{"echo hi"}}
	case "write_file":
		return map[string]any{"container_id": id, "file_name": "a.txt", "file_contents": "hello"}
	case "read_file":
		return map[string]any{"container_id": id, "path": "in.txt"}
	case "copy_project":
		return map[string]any{"container_id": id, "local_src_dir": filepath.Join(h.host, "proj")}
	case "copy_file":
		return map[string]any{"container_id": id, "local_src_file": filepath.Join(h.host, "proj", "main.py")}
	case "copy_file_from_sandbox":
		return map[string]any{"container_id": id, "container_src_path": "/app/in.txt", "local_dest_path": filepath.Join(h.host, "out.txt")}
	case "sandbox_stop", "sandbox_metrics":
		return map[string]any{"container_id": id}
	}
	Fail("unknown tool " + tool)
	return nil
}

// prepare puts what validArgs refer to in place: /app/in.txt in the
// sandbox, and proj/main.py and proj/sub/data.txt on the host.
func (h *toolHarness) prepare(id string) {
	GinkgoHelper()
	h.fake.putFile(id, "/app/in.txt", "from the sandbox\n")
	Expect(os.MkdirAll(filepath.Join(h.host, "proj", "sub"), 0o755)).To(Succeed())
	Expect(os.WriteFile(filepath.Join(h.host, "proj", "main.py"), []byte("print('hi')\n"), 0o644)).To(Succeed())
	Expect(os.WriteFile(filepath.Join(h.host, "proj", "sub", "data.txt"), []byte("data"), 0o644)).To(Succeed())
}

// methodOf is the Backend method a tool's backend errors come from.
var methodOf = map[string]string{
	"sandbox_initialize":     "Create",
	"list_sandboxes":         "List",
	"sandbox_exec":           "Exec",
	"write_file":             "Upload",
	"read_file":              "Download",
	"copy_project":           "Upload",
	"copy_file":              "Upload",
	"copy_file_from_sandbox": "Get",
	"sandbox_stop":           "Stop",
	"sandbox_metrics":        "Metrics",
}

var _ = Describe("the tools on a fake backend", Label("unit"), func() {
	var (
		h  *toolHarness
		id string // alice's sandbox
	)

	BeforeEach(func() {
		h = newToolHarness(Config{})
		id = h.fake.add("alice")
		h.prepare(id)
	})

	Describe("valid calls", func() {
		for _, tool := range allToolNames {
			It(tool+" succeeds with text and structured content", func() {
				res := h.call("alice", tool, jsonArgs(h.validArgs(tool, id)))
				Expect(res.IsError).To(BeFalse(), res.Text)
				Expect(res.Text).NotTo(BeEmpty())
				Expect(res.Structured).NotTo(BeEmpty())
			})
		}

		It("sandbox_initialize passes the validated request on and returns the new container_id", func() {
			res := h.call("alice", "sandbox_initialize", `{"image":"python:3","cpu":0.5,"memory":"256Mi","lifetime_seconds":60}`)
			Expect(res.IsError).To(BeFalse(), res.Text)
			var out InitializeResult
			res.into(&out)
			Expect(out.ContainerID).To(Equal("sbx-2"))
			Expect(out.Image).To(Equal("python:3"))
			Expect(out.WorkingDir).To(Equal("/app"))
			Expect(res.Text).To(ContainSubstring("container_id: sbx-2"))
			sb, err := h.fake.Get(context.Background(), contract.Caller{ID: "alice"}, "sbx-2")
			Expect(err).NotTo(HaveOccurred())
			Expect(sb.NanoCPUs).To(Equal(int64(5e8)))
			Expect(sb.MemoryBytes).To(Equal(int64(256 << 20)))
			Expect(sb.ExpiresAt.Sub(sb.CreatedAt).Seconds()).To(Equal(60.0))
		})

		It("sandbox_exec runs the commands in order, stops at the first failure and says how many did not run", func() {
			h.fake.exec = func(req execio.Request, out contract.OutputFunc) (execio.Result, error) {
				out("stdout", []byte("ran "+req.Shell+"\n"))
				if req.Shell == "false" {
					out("stderr", []byte("it failed\n"))
					return execio.Result{ExitCode: 3, DurationMillis: 5}, nil
				}
				return execio.Result{}, nil
			}
			res := h.call("alice", "sandbox_exec", fmt.Sprintf(`{"container_id":%q,"commands":["true","false","never"],"timeout_seconds":7,"workdir":"/tmp","env":{"B":"2","A":"1"}}`, id))
			Expect(res.IsError).To(BeTrue())
			var out ExecResult
			res.into(&out)
			Expect(out.Success).To(BeFalse())
			Expect(out.NotRun).To(Equal(1))
			Expect(out.Results).To(HaveLen(2))
			Expect(out.Results[1].ExitCode).To(Equal(3))
			Expect(out.Results[1].Stderr).To(Equal("it failed\n"))
			Expect(res.Text).To(ContainSubstring("Command 2 of 3 failed (exit code 3); the remaining 1 command(s) were not run."))
			Expect(h.fake.execs).To(HaveLen(2))
			Expect(h.fake.execs[0].TimeoutSeconds).To(Equal(int64(7)))
			Expect(h.fake.execs[0].WorkingDir).To(Equal("/tmp"))
			Expect(h.fake.execs[0].Env).To(Equal([]string{"A=1", "B=2"}))
		})

		It("sandbox_exec reports a timeout, and an error after output as the command's error", func() {
			h.fake.exec = func(req execio.Request, out contract.OutputFunc) (execio.Result, error) {
				return execio.Result{TimedOut: true, ExitCode: -1}, nil
			}
			res := h.call("alice", "sandbox_exec", fmt.Sprintf(`{"container_id":%q,"commands":["sleep 100"]}`, id))
			Expect(res.IsError).To(BeTrue())
			Expect(res.Text).To(ContainSubstring("timed out after 60 s"))
			Expect(res.Text).To(ContainSubstring("Command 1 of 1 failed (timed out)."))

			h.fake.exec = func(req execio.Request, out contract.OutputFunc) (execio.Result, error) {
				out("stdout", []byte("partial\n"))
				return execio.Result{}, fmt.Errorf("%w: the container exited", contract.ErrNotRunning)
			}
			res = h.call("alice", "sandbox_exec", fmt.Sprintf(`{"container_id":%q,"commands":["x"]}`, id))
			Expect(res.IsError).To(BeTrue())
			var out ExecResult
			res.into(&out)
			Expect(out.Results[0].Stdout).To(Equal("partial\n"))
			Expect(out.Results[0].ExitCode).To(Equal(-1))
			Expect(out.Results[0].Error).To(ContainSubstring("create a new one"))
		})

		It("write_file and read_file round-trip text, and read_file returns binary as base64", func() {
			res := h.call("alice", "write_file", fmt.Sprintf(`{"container_id":%q,"file_name":"src/m.py","file_contents":"x = 1\n","dest_dir":"/tmp"}`, id))
			Expect(res.IsError).To(BeFalse(), res.Text)
			Expect(h.fake.file(id, "/tmp/src/m.py")).To(Equal("x = 1\n"))
			res = h.call("alice", "read_file", fmt.Sprintf(`{"container_id":%q,"path":"/tmp/src/m.py"}`, id))
			Expect(res.Text).To(Equal("x = 1\n"))

			h.fake.putFile(id, "/app/bin", "\xff\xfe\x00")
			res = h.call("alice", "read_file", fmt.Sprintf(`{"container_id":%q,"path":"bin"}`, id))
			var out ReadFileResult
			res.into(&out)
			Expect(out.Encoding).To(Equal("base64"))
			Expect(out.Content).To(Equal(base64.StdEncoding.EncodeToString([]byte("\xff\xfe\x00"))))

			res = h.call("alice", "read_file", fmt.Sprintf(`{"container_id":%q,"path":"/app"}`, id))
			Expect(res.IsError).To(BeTrue())
			Expect(res.Text).To(ContainSubstring("is a directory"))
		})

		It("write_file accepts empty contents", func() {
			res := h.call("alice", "write_file", fmt.Sprintf(`{"container_id":%q,"file_name":"empty","file_contents":""}`, id))
			Expect(res.IsError).To(BeFalse(), res.Text)
			Expect(h.fake.file(id, "/app/empty")).To(Equal(""))
		})

		It("copy_project copies the tree's contents and lists skipped symlinks", func() {
			Expect(os.Symlink("/etc/passwd", filepath.Join(h.host, "proj", "link"))).To(Succeed())
			res := h.call("alice", "copy_project", jsonArgs(h.validArgs("copy_project", id)))
			Expect(res.IsError).To(BeFalse(), res.Text)
			Expect(h.fake.file(id, "/app/main.py")).To(Equal("print('hi')\n"))
			Expect(h.fake.file(id, "/app/sub/data.txt")).To(Equal("data"))
			var out TransferResult
			res.into(&out)
			Expect(out.Files).To(Equal(2))
			Expect(out.Skipped).To(ConsistOf("link"))
		})

		It("copy_file lands under the file's name in the working directory by default", func() {
			res := h.call("alice", "copy_file", jsonArgs(h.validArgs("copy_file", id)))
			Expect(res.IsError).To(BeFalse(), res.Text)
			Expect(h.fake.file(id, "/app/main.py")).To(Equal("print('hi')\n"))
		})

		It("copy_file_from_sandbox writes the host file, and replaces it only with overwrite", func() {
			args := h.validArgs("copy_file_from_sandbox", id)
			res := h.call("alice", "copy_file_from_sandbox", jsonArgs(args))
			Expect(res.IsError).To(BeFalse(), res.Text)
			Expect(os.ReadFile(filepath.Join(h.host, "out.txt"))).To(Equal([]byte("from the sandbox\n")))
			res = h.call("alice", "copy_file_from_sandbox", jsonArgs(args))
			Expect(res.IsError).To(BeTrue())
			Expect(res.Text).To(HavePrefix("Invalid arguments: "))
			args["overwrite"] = true
			res = h.call("alice", "copy_file_from_sandbox", jsonArgs(args))
			Expect(res.IsError).To(BeFalse(), res.Text)
		})

		It("list_sandboxes lists only the caller's sandboxes", func() {
			h.fake.add("bob")
			res := h.call("alice", "list_sandboxes", "")
			var out ListResult
			res.into(&out)
			Expect(out.Sandboxes).To(HaveLen(1))
			Expect(out.Sandboxes[0].ID).To(Equal(id))
			Expect(res.Text).To(ContainSubstring(id))
			res = h.call("carol", "list_sandboxes", "")
			Expect(res.Text).To(Equal("No sandboxes. Create one with sandbox_initialize."))
			res.into(&out)
			Expect(out.Sandboxes).NotTo(BeNil())
			Expect(out.Sandboxes).To(BeEmpty())
		})

		It("sandbox_stop removes the sandbox; a second stop finds nothing", func() {
			res := h.call("alice", "sandbox_stop", jsonArgs(h.validArgs("sandbox_stop", id)))
			Expect(res.IsError).To(BeFalse(), res.Text)
			Expect(h.fake.exists(id)).To(BeFalse())
			res = h.call("alice", "sandbox_stop", jsonArgs(h.validArgs("sandbox_stop", id)))
			Expect(res.IsError).To(BeTrue())
			Expect(res.Text).To(ContainSubstring("not found"))
		})

		It("the logs resource shows the output and the exec history", func() {
			h.fake.logs = contract.Logs{Output: "booted", Truncated: true, History: []history.Record{{Shell: "make test", ExitCode: 2, DurationMillis: 30}}}
			text, errMsg := h.readLogs("alice", id)
			Expect(errMsg).To(BeEmpty())
			Expect(text).To(ContainSubstring("== sandbox output ==\n[earlier output omitted]\nbooted\n"))
			Expect(text).To(ContainSubstring("exit=2 30ms $ make test"))
		})

		It("refuses a call without an identity", func() {
			msg := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_sandboxes"}}`
			raw, err := json.Marshal(h.srv.HandleMessage(context.Background(), json.RawMessage(msg)))
			Expect(err).NotTo(HaveOccurred())
			Expect(string(raw)).To(ContainSubstring("unauthenticated request"))
			Expect(h.fake.callCount()).To(BeZero())
		})
	})

	Describe("arguments", func() {
		// Every sandbox tool checks container_id and binds strictly before
		// the backend hears of the call.
		for _, tool := range sandboxToolNames {
			DescribeTable(tool+" refuses bad common arguments before calling the backend",
				func(mutate func(map[string]any), want string) {
					args := h.validArgs(tool, id)
					mutate(args)
					res := h.call("alice", tool, jsonArgs(args))
					Expect(res.IsError).To(BeTrue())
					Expect(res.Text).To(HavePrefix("Invalid arguments: "))
					Expect(res.Text).To(ContainSubstring(want))
					Expect(h.fake.callCount()).To(BeZero(), "the backend was called")
				},
				Entry("missing container_id", func(m map[string]any) { delete(m, "container_id") }, `"container_id" is required`),
				Entry("empty container_id", func(m map[string]any) { m["container_id"] = "" }, `"container_id" is required`),
				Entry("malformed container_id", func(m map[string]any) { m["container_id"] = "../etc" }, `container_id "../etc" is not a sandbox ID`),
				Entry("container_id of the wrong type", func(m map[string]any) { m["container_id"] = 42 }, `argument "container_id" must be a string, not number`),
				Entry("an unknown argument", func(m map[string]any) { m["bogus"] = 1 }, `unknown argument "bogus"`),
			)
		}

		It("refuses arguments that are not an object", func() {
			for _, tool := range allToolNames {
				res := h.call("alice", tool, `[1,2]`)
				Expect(res.IsError).To(BeTrue(), tool)
				Expect(res.Text).To(ContainSubstring("Invalid arguments: arguments must be a JSON object"), tool)
			}
			Expect(h.fake.callCount()).To(BeZero())
		})

		DescribeTable("refuses a tool's own bad arguments before calling the backend",
			func(tool, args, want string) {
				args = strings.ReplaceAll(strings.ReplaceAll(args, "ID", id), "HOST", h.host)
				res := h.call("alice", tool, args)
				Expect(res.IsError).To(BeTrue())
				Expect(res.Text).To(HavePrefix("Invalid arguments: "))
				Expect(res.Text).To(ContainSubstring(want))
				Expect(h.fake.callCount()).To(BeZero(), "the backend was called")
			},
			Entry(nil, "sandbox_initialize", `{"cpu":100}`, "cpu 100 is out of range"),
			Entry(nil, "sandbox_initialize", `{"cpu":"lots"}`, `argument "cpu" must be a number`),
			Entry(nil, "sandbox_initialize", `{"memory":"lots"}`, `memory "lots" is not a size`),
			Entry(nil, "sandbox_initialize", `{"network":"egress"}`, "--allow-egress"),
			Entry(nil, "sandbox_initialize", `{"network":"host"}`, `network "host" is not one of`),
			Entry(nil, "sandbox_initialize", `{"lifetime_seconds":0}`, "lifetime_seconds 0 is out of range"),
			Entry(nil, "sandbox_initialize", `{"image":"a b"}`, "is not an image reference"),
			Entry(nil, "list_sandboxes", `{"all":true}`, `unknown argument "all"`),
			Entry(nil, "sandbox_exec", `{"container_id":"ID"}`, `"commands" is required`),
			Entry(nil, "sandbox_exec", `{"container_id":"ID","commands":"ls"}`, `argument "commands" must be an array`),
			Entry(nil, "sandbox_exec", `{"container_id":"ID","commands":[" "]}`, "commands[0] is empty"),
			Entry(nil, "sandbox_exec", `{"container_id":"ID","commands":["ls"],"timeout_seconds":0}`, "timeout_seconds 0 is out of range"),
			Entry(nil, "sandbox_exec", `{"container_id":"ID","commands":["ls"],"workdir":"app"}`, "must be an absolute path"),
			Entry(nil, "sandbox_exec", `{"container_id":"ID","commands":["ls"],"env":{"1X":"y"}}`, "variable name"),
			Entry(nil, "write_file", `{"container_id":"ID","file_name":"a"}`, `"file_contents" is required`),
			Entry(nil, "write_file", `{"container_id":"ID","file_contents":"x"}`, `"file_name" is required`),
			Entry(nil, "write_file", `{"container_id":"ID","file_name":"/app/a","file_contents":"x","dest_dir":"/tmp"}`, "is absolute"),
			Entry(nil, "write_file", `{"container_id":"ID","file_name":"../a","file_contents":"x"}`, `".." component`),
			Entry(nil, "write_file", `{"container_id":"ID","file_name":"d/","file_contents":"x"}`, "must name a file"),
			Entry(nil, "read_file", `{"container_id":"ID"}`, `"path" is required`),
			Entry(nil, "read_file", `{"container_id":"ID","path":"/app/../etc/passwd"}`, `".." component`),
			Entry(nil, "copy_project", `{"container_id":"ID","local_src_dir":"proj"}`, "must be an absolute host path"),
			Entry(nil, "copy_project", `{"container_id":"ID","local_src_dir":"/etc"}`, "outside the allowed host directories"),
			Entry(nil, "copy_project", `{"container_id":"ID","local_src_dir":"HOST/proj/main.py"}`, "is not a directory; use copy_file"),
			Entry(nil, "copy_project", `{"container_id":"ID","local_src_dir":"HOST/proj","dest_dir":"../x"}`, `".." component`),
			Entry(nil, "copy_file", `{"container_id":"ID","local_src_file":"HOST/proj"}`, "is a directory; use copy_project"),
			Entry(nil, "copy_file", `{"container_id":"ID","local_src_file":"HOST/nothing"}`, "does not exist on the host"),
			Entry(nil, "copy_file", `{"container_id":"ID","local_src_file":"HOST/proj/main.py","dest_path":"d/"}`, "must name a file"),
			Entry(nil, "copy_file_from_sandbox", `{"container_id":"ID","container_src_path":"in.txt","local_dest_path":"/etc/x"}`, "outside the allowed host directories"),
			Entry(nil, "copy_file_from_sandbox", `{"container_id":"ID","container_src_path":"in.txt","local_dest_path":"HOST"}`, "is an allowed root itself"),
			Entry(nil, "copy_file_from_sandbox", `{"container_id":"ID","local_dest_path":"HOST/x"}`, `"container_src_path" is required`),
			Entry(nil, "copy_file_from_sandbox", `{"container_id":"ID","container_src_path":"in.txt","local_dest_path":"HOST/x","overwrite":"yes"}`, `argument "overwrite" must be a boolean`),
		)

		It("refuses host file tools when the server allows no host directory", func() {
			h = newToolHarness(Config{HostRoots: &HostRoots{}})
			id = h.fake.add("alice")
			for _, tool := range []string{"copy_project", "copy_file", "copy_file_from_sandbox"} {
				res := h.call("alice", tool, jsonArgs(h.validArgs(tool, id)))
				Expect(res.IsError).To(BeTrue(), tool)
				Expect(res.Text).To(ContainSubstring("--allow-host-dir"), tool)
			}
			Expect(h.fake.callCount()).To(BeZero())
		})

		It("the logs resource refuses a malformed ID", func() {
			_, errMsg := h.readLogs("alice", "..")
			Expect(errMsg).To(ContainSubstring("is not a sandbox ID"))
			Expect(h.fake.callCount()).To(BeZero())
		})
	})

	Describe("backend errors", func() {
		type kind struct {
			err  error
			want string
		}
		kinds := map[string]kind{
			"not found":     {fmt.Errorf("%w: %q", contract.ErrNotFound, "sbx-1"), `not found: it does not exist, belongs to another client, or was removed`},
			"quota":         {fmt.Errorf("%w: you already have 5 sandboxes; the limit is 5", contract.ErrQuota), "the limit is 5. Stop a sandbox you no longer need with sandbox_stop"},
			"image":         {fmt.Errorf("%w: python:9 is absent and the pull policy is Never", contract.ErrImageNotFound), "is absent and the pull policy is Never. Use an image that is present"},
			"unavailable":   {fmt.Errorf("%w: Docker Engine: connection refused", contract.ErrUnavailable), "connection refused. The sandbox backend"},
			"not running":   {fmt.Errorf("%w: exited (OOM-killed)", contract.ErrNotRunning), "stop it with sandbox_stop and create a new one"},
			"invalid":       {fmt.Errorf("%w: egress firewall not in place", contract.ErrInvalid), "invalid request: egress firewall not in place"},
			"too large":     {fmt.Errorf("%w: more than 5 bytes", execio.ErrTooLarge), "Move less data at once, or split it."},
			"path":          {fmt.Errorf("%w: /app/x", execio.ErrPathNotFound), "/app/x"},
			"cancelled":     {context.Canceled, "The request was cancelled."},
			"deadline":      {context.DeadlineExceeded, "The request took too long and was abandoned"},
			"anything else": {errFake, "Internal error: the fake backend broke"},
		}
		for _, tool := range allToolNames {
			for name, k := range kinds {
				if name == "not found" && (tool == "sandbox_initialize" || tool == "list_sandboxes") {
					continue
				}
				It(fmt.Sprintf("%s reports %s from %s as an error result the model can act on", tool, name, methodOf[tool]), func() {
					h.fake.fail[methodOf[tool]] = k.err
					res := h.call("alice", tool, jsonArgs(h.validArgs(tool, id)))
					Expect(res.IsError).To(BeTrue())
					Expect(res.Text).To(ContainSubstring(k.want))
					if name != "anything else" {
						Expect(res.Text).NotTo(HavePrefix("Internal error"))
					}
					if name == "not found" {
						Expect(res.Text).To(HavePrefix(fmt.Sprintf("Sandbox %q not found", id)))
						Expect(res.Text).To(ContainSubstring("Call list_sandboxes to see yours"))
					}
				})
			}
		}

		It("read_file names its own limit when the file is too large", func() {
			h.fake.fail["Download"] = fmt.Errorf("%w: more than 4MiB", execio.ErrTooLarge)
			res := h.call("alice", "read_file", jsonArgs(h.validArgs("read_file", id)))
			Expect(res.Text).To(ContainSubstring(`"in.txt" is larger than read_file's limit of 4MiB; use copy_file_from_sandbox`))
		})

		It("a failing download leaves nothing on the host", func() {
			h.fake.fail["Download"] = errFake
			res := h.call("alice", "copy_file_from_sandbox", jsonArgs(h.validArgs("copy_file_from_sandbox", id)))
			Expect(res.IsError).To(BeTrue())
			Expect(filepath.Join(h.host, "out.txt")).NotTo(BeAnExistingFile())
		})

		It("the logs resource reports a missing sandbox", func() {
			_, errMsg := h.readLogs("alice", "sbx-99")
			Expect(errMsg).To(ContainSubstring(`sandbox "sbx-99" not found (list_sandboxes shows yours)`))
		})
	})

	Describe("caps", func() {
		It("passes the per-identity sandbox limit on as an error the model can act on, per identity", func() {
			h.fake.max = 2
			Expect(h.call("alice", "sandbox_initialize", "{}").IsError).To(BeFalse())
			res := h.call("alice", "sandbox_initialize", "{}")
			Expect(res.IsError).To(BeTrue())
			Expect(res.Text).To(Equal("sandbox quota exceeded: you already have 2 sandboxes; the limit is 2. Stop a sandbox you no longer need with sandbox_stop (list_sandboxes shows yours), or, if the limit reached is CPU or memory, ask for less."))
			Expect(h.call("bob", "sandbox_initialize", "{}").IsError).To(BeFalse(), "bob has his own limit")
			Expect(h.call("alice", "sandbox_stop", jsonArgs(h.validArgs("sandbox_stop", id))).IsError).To(BeFalse())
			Expect(h.call("alice", "sandbox_initialize", "{}").IsError).To(BeFalse(), "stopping one makes room")
		})

		It("keeps the end of a command's output within the call's budget", func() {
			h = newToolHarness(Config{ExecOutputBudget: MinExecOutputBudget})
			id = h.fake.add("alice")
			h.fake.exec = func(req execio.Request, out contract.OutputFunc) (execio.Result, error) {
				for _, stream := range []string{"stdout", "stderr"} {
					for range 64 {
						out(stream, []byte(strings.Repeat("x", 1023)+"\n"))
					}
					out(stream, []byte("END\n"))
				}
				return execio.Result{StdoutBytes: 64<<10 + 4, StderrBytes: 64<<10 + 4}, nil
			}
			res := h.call("alice", "sandbox_exec", fmt.Sprintf(`{"container_id":%q,"commands":["yes"]}`, id))
			Expect(res.IsError).To(BeFalse(), res.Text)
			var out ExecResult
			res.into(&out)
			Expect(out.Results[0].Truncated).To(BeTrue())
			Expect(out.Results[0].Stdout).To(HavePrefix("[code-sandbox: stdout: the first "))
			Expect(out.Results[0].Stdout).To(HaveSuffix("END\n"))
			Expect(out.Results[0].Stderr).To(HaveSuffix("END\n"))
			Expect(len(out.Results[0].Stdout)+len(out.Results[0].Stderr)).To(BeNumerically("<=", MinExecOutputBudget+2*128), "both streams together stay within the call's budget")
			Expect(res.Text).To(ContainSubstring("[output truncated"))
		})

		It("holds a backend that ignores the per-stream limit to it", func() {
			h = newToolHarness(Config{OutputLimit: 1024})
			id = h.fake.add("alice")
			h.fake.exec = func(req execio.Request, out contract.OutputFunc) (execio.Result, error) {
				Expect(req.OutputLimitBytes).To(Equal(int64(1024)))
				for range 1024 {
					out("stderr", []byte(strings.Repeat("e", 1024)))
				}
				return execio.Result{}, nil
			}
			res := h.call("alice", "sandbox_exec", fmt.Sprintf(`{"container_id":%q,"commands":["noisy"]}`, id))
			var out ExecResult
			res.into(&out)
			Expect(len(out.Results[0].Stderr)).To(BeNumerically("<=", 1024+4096+128))
			Expect(out.Results[0].Truncated).To(BeTrue())
		})

		It("refuses more commands than one call may run", func() {
			cmds := make([]string, MaxCommandsPerExec+1)
			for i := range cmds {
				cmds[i] = "true"
			}
			res := h.call("alice", "sandbox_exec", jsonArgs(map[string]any{"container_id": id, "commands": cmds}))
			Expect(res.Text).To(ContainSubstring(fmt.Sprintf("%d commands in one call; the limit is %d", MaxCommandsPerExec+1, MaxCommandsPerExec)))
			Expect(h.fake.callCount()).To(BeZero())
		})

		It("refuses write_file contents beyond the file limit without uploading", func() {
			h = newToolHarness(Config{MaxFileBytes: 10})
			id = h.fake.add("alice")
			res := h.call("alice", "write_file", fmt.Sprintf(`{"container_id":%q,"file_name":"a","file_contents":"01234567890"}`, id))
			Expect(res.Text).To(Equal("Invalid arguments: file_contents is 11 bytes; the limit is 10"))
			Expect(h.fake.callCount()).To(BeZero())
		})

		It("refuses copy_file beyond the file limit without uploading", func() {
			h = newToolHarness(Config{MaxFileBytes: 4})
			id = h.fake.add("alice")
			h.prepare(id)
			res := h.call("alice", "copy_file", jsonArgs(h.validArgs("copy_file", id)))
			Expect(res.Text).To(ContainSubstring("local_src_file is 12B; the limit is 4B"))
			Expect(h.fake.has("Upload")).To(BeFalse())
		})

		It("refuses copy_project beyond the entry limit without uploading", func() {
			h = newToolHarness(Config{MaxUploadEntries: 1})
			id = h.fake.add("alice")
			h.prepare(id)
			res := h.call("alice", "copy_project", jsonArgs(h.validArgs("copy_project", id)))
			Expect(res.IsError).To(BeTrue())
			Expect(res.Text).To(ContainSubstring("more than 1 entries"))
			Expect(h.fake.has("Upload")).To(BeFalse())
		})

		It("read_file passes its limit to the backend and refuses a larger file", func() {
			h = newToolHarness(Config{MaxReadBytes: 8})
			id = h.fake.add("alice")
			h.prepare(id)
			res := h.call("alice", "read_file", jsonArgs(h.validArgs("read_file", id)))
			Expect(res.IsError).To(BeTrue())
			Expect(res.Text).To(ContainSubstring("larger than read_file's limit of 8B"))
		})
	})

	Describe("ownership", func() {
		for _, tool := range sandboxToolNames {
			It(tool+" treats another identity's sandbox as not found and leaves it alone", func() {
				res := h.call("bob", tool, jsonArgs(h.validArgs(tool, id)))
				Expect(res.IsError).To(BeTrue())
				Expect(res.Text).To(HavePrefix(fmt.Sprintf("Sandbox %q not found: it does not exist, belongs to another client", id)))
				Expect(h.fake.exists(id)).To(BeTrue())
				Expect(h.fake.file(id, "/app/a.txt")).To(Equal(noFile))
				Expect(h.fake.execs).To(BeEmpty())
				Expect(filepath.Join(h.host, "out.txt")).NotTo(BeAnExistingFile())
			})
		}

		It("the logs resource treats another identity's sandbox as not found", func() {
			_, errMsg := h.readLogs("bob", id)
			Expect(errMsg).To(ContainSubstring("not found"))
			text, errMsg := h.readLogs("alice", id)
			Expect(errMsg).To(BeEmpty())
			Expect(text).To(ContainSubstring("== exec history =="))
		})
	})
})
