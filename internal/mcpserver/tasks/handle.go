package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// request is a task method's JSON-RPC request.
type request struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		TaskID         *string         `json:"taskId"`
		InputResponses json.RawMessage `json:"inputResponses"`
		Meta           *mcp.Meta       `json:"_meta"`
	} `json:"params"`
}

// Modern reports whether msg is a request of MCP 2026-07-28 or later (by
// the protocol version in its _meta), which is when its task methods are
// this package's.
func Modern(msg []byte) bool {
	var r request
	if json.Unmarshal(msg, &r) != nil {
		return false
	}
	v := r.Params.Meta.ProtocolVersion()
	return mcp.IsModernProtocol(v) && mcp.IsValidProtocolVersion(v)
}

// Handle answers msg, a JSON-RPC request of one of the task methods (see
// IsMethod) in MCP 2026-07-28, for caller. header is the HTTP request's
// (nil over stdio): over HTTP the request is held to the revision's
// header rules as mcp-go holds every other method to them (the version
// header matches _meta, Mcp-Method names the method, and, for the task
// methods, Mcp-Name the taskId). It returns the JSON-RPC response and, when
// that is an error, its code (0 otherwise), from which HTTP picks a
// status (HTTPStatus).
func (s *Server) Handle(ctx context.Context, caller contract.Caller, msg []byte, header http.Header) ([]byte, int) {
	var req request
	if err := json.Unmarshal(msg, &req); err != nil {
		return response(nil, nil, &Error{Code: mcp.PARSE_ERROR, Message: "Parse error: " + err.Error()})
	}
	result, err := s.handle(ctx, caller, &req, header)
	return response(req.ID, result, err)
}

// HTTPStatus is the status MCP 2026-07-28 gives a JSON-RPC error code (0:
// a result).
func HTTPStatus(code int) int {
	switch code {
	case 0, mcp.INTERNAL_ERROR:
		return http.StatusOK
	case mcp.METHOD_NOT_FOUND:
		return http.StatusNotFound
	default:
		return http.StatusBadRequest
	}
}

func response(id json.RawMessage, result any, e *Error) ([]byte, int) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	if e != nil {
		body := map[string]any{"code": e.Code, "message": e.Message}
		if e.Data != nil {
			body["data"] = e.Data
		}
		out, _ := json.Marshal(map[string]any{"jsonrpc": mcp.JSONRPC_VERSION, "id": id, "error": body})
		return out, e.Code
	}
	out, err := json.Marshal(map[string]any{"jsonrpc": mcp.JSONRPC_VERSION, "id": id, "result": result})
	if err != nil {
		return response(id, nil, &Error{Code: mcp.INTERNAL_ERROR, Message: "encoding the result: " + err.Error()})
	}
	return out, 0
}

// ack is the empty result of tasks/update and tasks/cancel.
var ack = map[string]any{"resultType": string(mcp.ResultTypeComplete)}

func (s *Server) handle(ctx context.Context, caller contract.Caller, req *request, header http.Header) (any, *Error) {
	meta := req.Params.Meta
	version := meta.ProtocolVersion()
	if header != nil {
		if e := checkHeaders(header, version, req); e != nil {
			return nil, e
		}
	}
	if version == "" {
		return nil, invalidParams("missing or invalid _meta field %s", mcp.MetaKeyProtocolVersion)
	}
	caps := meta.ClientCapabilities()
	if caps == nil {
		return nil, invalidParams("missing or invalid _meta field %s", mcp.MetaKeyClientCapabilities)
	}
	if !DeclaredIn(caps) {
		return nil, missingCapability(req.Method)
	}
	if req.Params.TaskID == nil || *req.Params.TaskID == "" {
		return nil, invalidParams(`Invalid params: "taskId" is required`)
	}
	taskID := *req.Params.TaskID
	ref, err := Parse(caller.ID, taskID)
	if err != nil {
		return nil, unknownTask()
	}
	switch req.Method {
	case MethodGet:
		t, err := s.get(ctx, caller, ref, taskID)
		if err != nil {
			return nil, err
		}
		return struct {
			ResultType string `json:"resultType"`
			Task
		}{string(mcp.ResultTypeComplete), t}, nil
	case MethodUpdate:
		// No task of this server ever asks for input (its status is never
		// input_required), so every response answers a key that is not
		// outstanding, which the extension says to ignore; the task must
		// still exist.
		if raw := req.Params.InputResponses; len(raw) > 0 && raw[0] != '{' {
			return nil, invalidParams(`Invalid params: "inputResponses" must be an object`)
		}
		if _, err := s.get(ctx, caller, ref, taskID); err != nil {
			return nil, err
		}
		return ack, nil
	case MethodCancel:
		if err := s.src.Cancel(ctx, caller, ref); err != nil {
			return nil, backendError(err)
		}
		return ack, nil
	}
	return nil, &Error{Code: mcp.METHOD_NOT_FOUND, Message: "Method not found: " + req.Method}
}

func (s *Server) get(ctx context.Context, caller contract.Caller, ref Ref, taskID string) (Task, *Error) {
	t, err := s.src.Get(ctx, caller, ref)
	if err != nil {
		return Task{}, backendError(err)
	}
	t.TaskID = taskID
	return t, nil
}

func unknownTask() *Error {
	return invalidParams("Failed to retrieve task: Task not found (it was not issued to this caller by this server, or its background process is no longer kept: its sandbox ended, or it was dropped as one of the oldest finished)")
}

// backendError maps a Source's error: a task whose handle or sandbox is
// gone is unknown (-32602, as the extension asks), anything else is the
// server's failure to answer (-32603).
func backendError(err error) *Error {
	switch {
	case errors.Is(err, ErrUnknownTask), errors.Is(err, contract.ErrNotFound):
		return unknownTask()
	case errors.Is(err, context.Canceled):
		return &Error{Code: mcp.INTERNAL_ERROR, Message: "The request was cancelled."}
	}
	return &Error{Code: mcp.INTERNAL_ERROR, Message: fmt.Sprintf("Internal error: %v", err)}
}

// checkHeaders holds a task method's HTTP request to MCP 2026-07-28's
// header rules, as mcp-go holds the methods it serves (SEP-2243 and
// SEP-2663's routing headers): HeaderMismatch (-32020) otherwise.
func checkHeaders(h http.Header, version string, req *request) *Error {
	mismatch := func(format string, args ...any) *Error {
		return &Error{Code: mcp.HEADER_MISMATCH, Message: "Header mismatch: " + fmt.Sprintf(format, args...)}
	}
	if h.Get(mcp.HeaderLastEventID) != "" {
		return mismatch("%s is not supported in protocol version %s: streams are not resumable", mcp.HeaderLastEventID, mcp.ProtocolVersion20260728)
	}
	hv := h.Get(mcp.HeaderProtocolVersion)
	if hv == "" {
		return mismatch("%s header is required", mcp.HeaderProtocolVersion)
	}
	if version == "" {
		return invalidParams("missing or invalid _meta field %s", mcp.MetaKeyProtocolVersion)
	}
	if hv != version {
		return mismatch("%s header %s does not match request %s %s", mcp.HeaderProtocolVersion, hv, mcp.MetaKeyProtocolVersion, version)
	}
	if err := mcp.ValidateStandardHeaders(h.Get, version, mcp.MCPMethod(req.Method), nil); err != nil {
		return mismatch("%v", err)
	}
	name := h.Get(mcp.HeaderName)
	if name == "" {
		return mismatch("%s header is required for %s (it carries params.taskId)", mcp.HeaderName, req.Method)
	}
	decoded, ok := mcp.DecodeHeaderValue(name)
	if !ok {
		return mismatch("%s: invalid Base64 encoding", mcp.HeaderName)
	}
	if req.Params.TaskID != nil && decoded != *req.Params.TaskID {
		return mismatch("%s header value %q does not match params.taskId %q", mcp.HeaderName, decoded, *req.Params.TaskID)
	}
	return nil
}

// RequestDeclares reports whether msg, a JSON-RPC request, is of MCP
// 2026-07-28 or later and declares the extension in its _meta: the
// requests whose answers may be tasks.
func RequestDeclares(msg []byte) bool {
	var r request
	if json.Unmarshal(msg, &r) != nil {
		return false
	}
	v := r.Params.Meta.ProtocolVersion()
	return mcp.IsModernProtocol(v) && DeclaredIn(r.Params.Meta.ClientCapabilities())
}
