/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package tasks

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// fakeSource is the pure-logic stand-in for the process backend: one
// known handle per container, owned by "alice".
type fakeSource struct {
	cancelled []Ref
}

func (f *fakeSource) Get(_ context.Context, caller contract.Caller, ref Ref) (Task, error) {
	if caller.ID != "alice" || ref.Handle != "p-1" {
		return Task{}, ErrUnknownTask
	}
	return Task{Status: StatusWorking, CreatedAt: Timestamp(time.Unix(0, 0)), LastUpdatedAt: Timestamp(time.Unix(0, 0))}, nil
}

func (f *fakeSource) Cancel(_ context.Context, caller contract.Caller, ref Ref) error {
	if caller.ID != "alice" || ref.Handle != "p-1" {
		return fmt.Errorf("%w: gone", contract.ErrNotFound)
	}
	f.cancelled = append(f.cancelled, ref)
	return nil
}

var _ = Describe("task IDs", func() {
	ref := Ref{ContainerID: "c-1", Handle: "p-1", TimeoutSeconds: 60, ExpiresAt: 1800000000}

	It("verify for the identity they were minted for, and carry the handle", func() {
		id := Mint("alice", ref)
		Expect(id).To(HavePrefix("t1."))
		Expect(id).To(MatchRegexp(`^[A-Za-z0-9_.-]+$`), "header-safe: it travels in Mcp-Name")
		got, err := Parse("alice", id)
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(Equal(ref))
	})

	It("are unknown to any other identity", func() {
		Expect(Parse("bob", Mint("alice", ref))).Error().To(MatchError(ErrUnknownTask))
		Expect(Parse("", Mint("alice", ref))).Error().To(MatchError(ErrUnknownTask))
	})

	It("refuse any change: another handle or sandbox in the payload, a flipped MAC byte, garbage", func() {
		id := Mint("alice", ref)
		parts := strings.Split(id, ".")
		forged, _ := json.Marshal(Ref{ContainerID: "someone-elses", Handle: "p-1"})
		mac, _ := base64.RawURLEncoding.DecodeString(parts[2])
		mac[0] ^= 1
		for _, bad := range []string{
			parts[0] + "." + base64.RawURLEncoding.EncodeToString(forged) + "." + parts[2],
			parts[0] + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString(mac),
			"t2." + parts[1] + "." + parts[2],
			parts[0] + "." + parts[1],
			id + ".x",
			"", "t1..", "../../etc/passwd", strings.Repeat("A", 600),
		} {
			Expect(Parse("alice", bad)).Error().To(MatchError(ErrUnknownTask), "%q", bad)
		}
	})
})

var _ = Describe("Rewrite", func() {
	It("turns a Created tool result into a flat CreateTaskResult, keeping serverInfo", func() {
		ttl := int64(5000)
		res := Created(Task{TaskID: "t1.x.y", Status: StatusWorking, CreatedAt: "2026-01-01T00:00:00Z", LastUpdatedAt: "2026-01-01T00:00:00Z",
			TTLMs: &ttl, PollIntervalMs: 2000, Result: &mcp.CallToolResult{}})
		res.Meta.AdditionalFields["io.modelcontextprotocol/serverInfo"] = map[string]any{"name": "x"}
		msg, err := json.Marshal(mcp.JSONRPCResponse{JSONRPC: "2.0", ID: mcp.NewRequestId(7), Result: res})
		Expect(err).NotTo(HaveOccurred())
		out, ok := Rewrite(msg)
		Expect(ok).To(BeTrue())
		var got struct {
			ID     int            `json:"id"`
			Result map[string]any `json:"result"`
		}
		Expect(json.Unmarshal(out, &got)).To(Succeed())
		Expect(got.ID).To(Equal(7))
		Expect(got.Result).To(HaveKeyWithValue("resultType", "task"))
		Expect(got.Result).To(HaveKeyWithValue("taskId", "t1.x.y"))
		Expect(got.Result).To(HaveKeyWithValue("status", "working"))
		Expect(got.Result).To(HaveKeyWithValue("ttlMs", BeNumerically("==", 5000)))
		Expect(got.Result).To(HaveKeyWithValue("pollIntervalMs", BeNumerically("==", 2000)))
		for _, k := range []string{"content", "task", "result", "error", "inputRequests", "requestState", "ttl", "pollInterval"} {
			Expect(got.Result).NotTo(HaveKey(k))
		}
		Expect(got.Result["_meta"]).To(Equal(map[string]any{"io.modelcontextprotocol/serverInfo": map[string]any{"name": "x"}}))
	})

	It("leaves every other message alone, a tool's text that spells the marker included", func() {
		for _, msg := range []string{
			`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"\"dev.code-sandbox/create-task\""}]}}`,
			`{"jsonrpc":"2.0","method":"notifications/progress","params":{"x":"\"dev.code-sandbox/create-task\""}}`,
			`{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"\"dev.code-sandbox/create-task\""}}`,
			`not json "dev.code-sandbox/create-task"`,
		} {
			out, ok := Rewrite([]byte(msg))
			Expect(ok).To(BeFalse(), msg)
			Expect(string(out)).To(Equal(msg))
		}
	})
})

var _ = Describe("Server.Handle", func() {
	const v = "2026-07-28"
	var (
		src *fakeSource
		s   *Server
		id  string
	)
	BeforeEach(func() {
		src = &fakeSource{}
		s = &Server{src: src}
		id = Mint("alice", Ref{ContainerID: "c-1", Handle: "p-1"})
	})
	msg := func(method, taskID string, declare bool) []byte {
		caps := map[string]any{}
		if declare {
			caps["extensions"] = map[string]any{ExtensionID: map[string]any{}}
		}
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 3, "method": method, "params": map[string]any{
			"taskId": taskID, "_meta": map[string]any{mcp.MetaKeyProtocolVersion: v, mcp.MetaKeyClientCapabilities: caps}}})
		return b
	}
	headers := func(method, name string) http.Header {
		h := http.Header{}
		h.Set(mcp.HeaderProtocolVersion, v)
		h.Set(mcp.HeaderMethod, method)
		if name != "" {
			h.Set(mcp.HeaderName, name)
		}
		return h
	}
	call := func(caller string, m []byte, h http.Header) (map[string]any, int) {
		out, code := s.Handle(context.Background(), contract.Caller{ID: caller}, m, h)
		var resp map[string]any
		Expect(json.Unmarshal(out, &resp)).To(Succeed(), string(out))
		Expect(resp["id"]).To(BeNumerically("==", 3))
		return resp, code
	}

	It("answers tasks/get with the task and resultType complete", func() {
		resp, code := call("alice", msg(MethodGet, id, true), headers(MethodGet, id))
		Expect(code).To(Equal(0))
		Expect(resp["result"]).To(And(HaveKeyWithValue("resultType", "complete"), HaveKeyWithValue("taskId", id), HaveKeyWithValue("status", "working"), HaveKeyWithValue("ttlMs", BeNil())))
	})

	It("acks tasks/cancel and tasks/update with an empty complete result, and cancels the handle", func() {
		for _, m := range []string{MethodCancel, MethodUpdate} {
			resp, code := call("alice", msg(m, id, true), headers(m, id))
			Expect(code).To(Equal(0))
			Expect(resp["result"]).To(Equal(map[string]any{"resultType": "complete"}))
		}
		Expect(src.cancelled).To(HaveLen(1))
	})

	It("refuses every method with -32021 and the capability in data when the request did not declare the extension", func() {
		for _, m := range []string{MethodGet, MethodUpdate, MethodCancel} {
			resp, code := call("alice", msg(m, "gate-test", false), headers(m, "gate-test"))
			Expect(code).To(Equal(mcp.MISSING_REQUIRED_CLIENT_CAPABILITY))
			Expect(HTTPStatus(code)).To(Equal(http.StatusBadRequest))
			Expect(resp["error"]).To(HaveKeyWithValue("data", map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{ExtensionID: map[string]any{}}}}))
		}
		Expect(src.cancelled).To(BeEmpty())
	})

	It("gives another caller's, a tampered or a made-up task ID -32602, and cancels nothing", func() {
		for _, c := range []struct{ caller, id string }{{"bob", id}, {"alice", id[:len(id)-2] + "AA"}, {"alice", "made-up"}} {
			for _, m := range []string{MethodGet, MethodUpdate, MethodCancel} {
				resp, code := call(c.caller, msg(m, c.id, true), headers(m, c.id))
				Expect(code).To(Equal(mcp.INVALID_PARAMS), "%s %s %s", c.caller, m, c.id)
				Expect(resp["error"]).To(HaveKeyWithValue("message", ContainSubstring("Task not found")))
			}
		}
		Expect(src.cancelled).To(BeEmpty())
	})

	It("holds HTTP requests to the header rules: Mcp-Name must carry the taskId, Mcp-Method the method", func() {
		for _, h := range []http.Header{
			headers(MethodGet, ""),
			headers(MethodGet, "another-task"),
			headers(MethodCancel, id),
			func() http.Header { x := headers(MethodGet, id); x.Del(mcp.HeaderProtocolVersion); return x }(),
			func() http.Header {
				x := headers(MethodGet, id)
				x.Set(mcp.HeaderProtocolVersion, "2025-11-25")
				return x
			}(),
			func() http.Header { x := headers(MethodGet, id); x.Set(mcp.HeaderLastEventID, "1"); return x }(),
		} {
			_, code := call("alice", msg(MethodGet, id, true), h)
			Expect(code).To(Equal(mcp.HEADER_MISMATCH), "%v", h)
		}
		// A base64 Mcp-Name that decodes to the taskId is the same name.
		_, code := call("alice", msg(MethodGet, id, true), headers(MethodGet, "=?base64?"+base64.StdEncoding.EncodeToString([]byte(id))+"?="))
		Expect(code).To(Equal(0))
	})

	It("refuses a request without taskId or client capabilities with -32602", func() {
		resp, code := call("alice", msg(MethodGet, "", true), nil)
		Expect(code).To(Equal(mcp.INVALID_PARAMS))
		Expect(resp["error"]).To(HaveKeyWithValue("message", ContainSubstring("taskId")))
		noCaps := []byte(`{"jsonrpc":"2.0","id":3,"method":"tasks/get","params":{"taskId":"x","_meta":{"` + mcp.MetaKeyProtocolVersion + `":"2026-07-28"}}}`)
		_, code = call("alice", noCaps, nil)
		Expect(code).To(Equal(mcp.INVALID_PARAMS))
	})

	It("tells modern requests and declaring ones apart", func() {
		Expect(Modern(msg(MethodGet, id, false))).To(BeTrue())
		Expect(RequestDeclares(msg(MethodGet, id, true))).To(BeTrue())
		Expect(RequestDeclares(msg(MethodGet, id, false))).To(BeFalse())
		old := []byte(`{"jsonrpc":"2.0","id":3,"method":"tasks/get","params":{"taskId":"x","_meta":{"` + mcp.MetaKeyProtocolVersion + `":"2025-11-25","` + mcp.MetaKeyClientCapabilities + `":{"extensions":{"` + ExtensionID + `":{}}}}}}`)
		Expect(Modern(old)).To(BeFalse())
		Expect(RequestDeclares(old)).To(BeFalse())
	})
})

var _ = Describe("Option", func() {
	It("advertises the extension in server/discover but not in a 2025-11-25 initialize, and attaches the Server", func() {
		s := server.NewMCPServer("x", "1", server.WithToolCapabilities(false), Option(&fakeSource{}))
		Expect(For(s)).NotTo(BeNil())
		Expect(For(server.NewMCPServer("y", "1"))).To(BeNil())
		init := s.HandleMessage(context.Background(), []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"extensions":{"`+ExtensionID+`":{}}},"clientInfo":{"name":"c","version":"1"}}}`))
		b, _ := json.Marshal(init)
		Expect(string(b)).NotTo(ContainSubstring(ExtensionID))
		disc := s.HandleMessage(context.Background(), []byte(`{"jsonrpc":"2.0","id":2,"method":"server/discover","params":{"_meta":{"`+mcp.MetaKeyProtocolVersion+`":"2026-07-28","`+mcp.MetaKeyClientCapabilities+`":{}}}}`))
		b, _ = json.Marshal(disc)
		Expect(string(b)).To(ContainSubstring(`"extensions":{"` + ExtensionID + `":{}}`))
		// The initialize answer took the extension out of a copy: discover
		// after it still has it.
		b, _ = json.Marshal(s.HandleMessage(context.Background(), []byte(`{"jsonrpc":"2.0","id":3,"method":"server/discover","params":{"_meta":{"`+mcp.MetaKeyProtocolVersion+`":"2026-07-28","`+mcp.MetaKeyClientCapabilities+`":{}}}}`)))
		Expect(string(b)).To(ContainSubstring(ExtensionID))
	})
})
