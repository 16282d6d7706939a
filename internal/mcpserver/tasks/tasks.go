// Package tasks is the MCP Tasks extension (io.modelcontextprotocol/tasks,
// SEP-2663) over the server's background process handles: a sandbox_exec
// that would hand back a handle answers a client that declared the
// extension on its request with a task instead, and tasks/get,
// tasks/update and tasks/cancel act on that same handle (the process the
// sandbox's helper supervises, see docs/mcp.md). There is no second
// registry: a task ID is a signed reference to a handle (id.go), so any
// replica answers for any task, and a task lives exactly as long as its
// handle.
//
// mcp-go (v1.2.1) does not implement the extension, and has no hook that
// can answer a method it does not know or return a result other than a
// CallToolResult from a tool. So the transports (package transport) route
// the three methods here before mcp-go sees them (Server.Handle), and a tool
// returns its CreateTaskResult as a marked CallToolResult (Created) that
// the transports turn into the extension's shape on the way out (Rewrite).
// The extension is defined for MCP 2026-07-28 only: a request of an
// earlier revision never gets a task, and its tasks/* calls reach mcp-go
// unchanged.
package tasks

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"sync"
	"time"
	"weak"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// ExtensionID names the extension in capabilities.
const ExtensionID = "io.modelcontextprotocol/tasks"

// The extension's methods. tasks/result and tasks/list of the 2025-11-25
// experimental tasks are gone from it (mcp-go answers them -32601 in
// 2026-07-28).
const (
	MethodGet    = "tasks/get"
	MethodUpdate = "tasks/update"
	MethodCancel = "tasks/cancel"
)

// IsMethod reports whether method is one this package answers.
func IsMethod(method string) bool {
	return method == MethodGet || method == MethodUpdate || method == MethodCancel
}

// Task statuses.
const (
	StatusWorking   = "working"
	StatusCompleted = "completed"
	StatusFailed    = "failed"
	StatusCancelled = "cancelled"
)

// PollInterval is the pollIntervalMs the server suggests: a tasks/get costs
// one call on the sandbox's helper.
const PollInterval = 2 * time.Second

// Task is the extension's Task, with the fields of DetailedTask: Result
// once completed, Error once failed.
type Task struct {
	TaskID        string `json:"taskId"`
	Status        string `json:"status"`
	StatusMessage string `json:"statusMessage,omitempty"`
	CreatedAt     string `json:"createdAt"`
	LastUpdatedAt string `json:"lastUpdatedAt"`
	// TTLMs is null for unlimited: it is always written.
	TTLMs          *int64              `json:"ttlMs"`
	PollIntervalMs int64               `json:"pollIntervalMs,omitempty"`
	Result         *mcp.CallToolResult `json:"result,omitempty"`
	Error          *ErrorObject        `json:"error,omitempty"`
}

// ErrorObject is a failed task's JSON-RPC error.
type ErrorObject struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// Timestamp formats t as the extension's ISO 8601 timestamps.
func Timestamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// TTL is the ttlMs of a task created at created for a sandbox that ends
// at expires (Unix seconds; 0: unknown, which is null, unlimited).
func TTL(created time.Time, expires int64) *int64 {
	if expires == 0 {
		return nil
	}
	ms := max(time.Unix(expires, 0).Sub(created).Milliseconds(), 1)
	return &ms
}

// Source is what the tasks stand for: the server's background processes.
// Get and Cancel fail with ErrUnknownTask when the handle is gone (its
// sandbox ended, or it was dropped as the oldest finished one), and with
// the backend's errors otherwise.
type Source interface {
	// Get returns the task ref stands for; its TaskID is filled in by the
	// caller.
	Get(ctx context.Context, caller contract.Caller, ref Ref) (Task, error)
	// Cancel kills the process's tree; a process that has ended stays as
	// it is.
	Cancel(ctx context.Context, caller contract.Caller, ref Ref) error
}

// Server answers the extension's methods from a Source.
type Server struct {
	src Source
}

// servers maps an MCP server to the Server that answers its task methods,
// so that whichever transport serves it answers them exactly when the
// server advertises the extension. Weak keys: a server that is gone takes
// its entry with it.
var servers sync.Map // weak.Pointer[server.MCPServer] → *Server

// Option advertises the extension on an MCP server and attaches a Server
// answering its methods from src, for For to find.
func Option(src Source) server.ServerOption {
	return func(s *server.MCPServer) {
		server.WithExtensions(map[string]any{ExtensionID: map[string]any{}})(s)
		// The extension is not defined for the session-based revisions
		// (2025-11-25 and earlier), whose initialize shares the
		// capabilities of server/discover: take it out of theirs.
		hooks := s.GetHooks()
		if hooks == nil {
			hooks = &server.Hooks{}
			server.WithHooks(hooks)(s)
		}
		hooks.AddAfterInitialize(func(_ context.Context, _ any, _ *mcp.InitializeRequest, res *mcp.InitializeResult) {
			ext := map[string]any{}
			for k, v := range res.Capabilities.Extensions {
				if k != ExtensionID {
					ext[k] = v
				}
			}
			res.Capabilities.Extensions = nil
			if len(ext) > 0 {
				res.Capabilities.Extensions = ext
			}
		})
		key := weak.Make(s)
		servers.Store(key, &Server{src: src})
		runtime.AddCleanup(s, func(k weak.Pointer[server.MCPServer]) { servers.Delete(k) }, key)
	}
}

// For returns the Server attached to s, or nil when s does not offer the
// extension.
func For(s *server.MCPServer) *Server {
	if s == nil {
		return nil
	}
	v, ok := servers.Load(weak.Make(s))
	if !ok {
		return nil
	}
	return v.(*Server)
}

// Declared reports whether the request being handled declared the
// extension in its per-request client capabilities (MCP 2026-07-28 and
// later only: the extension is not defined for earlier revisions).
func Declared(ctx context.Context) bool {
	info := server.RequestProtocolInfoFromContext(ctx)
	return info != nil && info.Modern && DeclaredIn(info.ClientCapabilities)
}

// DeclaredIn reports whether caps declare the extension.
func DeclaredIn(caps *mcp.ClientCapabilities) bool {
	if caps == nil {
		return false
	}
	_, ok := caps.Extensions[ExtensionID]
	return ok
}

// createdKey marks a tool result that stands for a CreateTaskResult; it
// never leaves the server (Rewrite replaces the whole result).
const createdKey = "dev.code-sandbox/create-task"

// Created is the tool result that answers a tools/call with task t (no
// Result or Error): the transports rewrite it into the extension's
// CreateTaskResult (Rewrite).
func Created(t Task) *mcp.CallToolResult {
	t.Result, t.Error = nil, nil
	return &mcp.CallToolResult{
		Result:  mcp.Result{ResultType: mcp.ResultType("task"), Meta: mcp.NewMetaFromMap(map[string]any{createdKey: t})},
		Content: []mcp.Content{},
	}
}

// Rewrite turns a JSON-RPC response whose result Created made into the
// extension's CreateTaskResult: the flat Task with resultType "task", and
// the result's other _meta (serverInfo) kept. Any other message is
// returned unchanged with false.
func Rewrite(msg []byte) ([]byte, bool) {
	if !containsKey(msg) {
		return msg, false
	}
	var resp struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  *struct {
			Meta map[string]json.RawMessage `json:"_meta"`
		} `json:"result"`
	}
	if json.Unmarshal(msg, &resp) != nil || resp.Result == nil || len(resp.ID) == 0 {
		return msg, false
	}
	raw, ok := resp.Result.Meta[createdKey]
	if !ok {
		return msg, false
	}
	var task map[string]json.RawMessage
	if json.Unmarshal(raw, &task) != nil {
		return msg, false
	}
	delete(resp.Result.Meta, createdKey)
	result := map[string]any{}
	for k, v := range task {
		result[k] = v
	}
	result["resultType"] = "task"
	if len(resp.Result.Meta) > 0 {
		result["_meta"] = resp.Result.Meta
	}
	out, err := json.Marshal(map[string]any{"jsonrpc": mcp.JSONRPC_VERSION, "id": resp.ID, "result": result})
	if err != nil {
		return msg, false
	}
	return out, true
}

func containsKey(msg []byte) bool {
	return bytes.Contains(msg, []byte(`"`+createdKey+`"`))
}

// Error is a JSON-RPC error this package answers with.
type Error struct {
	Code    int
	Message string
	Data    any
}

func (e *Error) Error() string { return fmt.Sprintf("%d: %s", e.Code, e.Message) }

func invalidParams(format string, args ...any) *Error {
	return &Error{Code: mcp.INVALID_PARAMS, Message: fmt.Sprintf(format, args...)}
}

// missingCapability is the answer to a task method from a request that did
// not declare the extension (SEP-2575's Missing Required Client
// Capability, with the capability in data as the extension shows it).
func missingCapability(method string) *Error {
	return &Error{Code: mcp.MISSING_REQUIRED_CLIENT_CAPABILITY,
		Message: fmt.Sprintf("Missing required client capability: %s needs the %s extension declared in the request's _meta %s", method, ExtensionID, mcp.MetaKeyClientCapabilities),
		Data:    map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{ExtensionID: map[string]any{}}}}}
}
