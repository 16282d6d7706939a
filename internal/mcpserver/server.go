// Package mcpserver is the Model Context Protocol server that gives agents
// disposable, hardened sandboxes: the tools (sandbox_initialize,
// sandbox_exec, file transfer…) and the logs resource, with one argument
// binder for them all (bindArgs). Serving it is package transport's (stdio
// and streamable HTTP with their checks: Origin and Host, identity-bound
// sessions, message caps); authentication is package auth's;
// what the server and its backends agree on (Caller, Backend, the error
// kinds) is package contract's, which imports no protocol library. Where
// sandboxes live is a Backend's business: a session.Manager on the Docker
// driver (dockerbackend) or the Kubernetes one (kubebackend).
package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/tasks"
)

// ServerName is the implementation name announced to clients.
const ServerName = "code-sandbox-mcp"

// instructions are the server's instructions to the model; %s is the
// sandbox's default working directory (Config.SandboxWorkingDir).
const instructions = `Runs code in disposable, hardened sandboxes (no network unless allowed, no capabilities, read-only root filesystem, non-root user, bounded CPU, memory, processes and disk).
Call sandbox_initialize first; it returns a container_id that every other tool takes. Write files with write_file (or copy_project/copy_file from allowed host directories), run shell commands with sandbox_exec, read results with read_file, and call sandbox_stop when done. Writable paths: the working directory%s, /tmp and /var/tmp. Idle sandboxes are removed automatically.`

// ListCacheTTL is the freshness MCP 2026-07-28 clients are told (ttlMs,
// SEP-2549) for tools/list, resources/list, resources/templates/list and
// server/discover. Those answers are fixed for the life of a server
// process: they depend on its flags and version only, never on the caller
// (no tool or template is filtered per identity), so their cacheScope is
// "public". They change when a new version rolls out, and the server
// declares no listChanged to announce that, so the TTL is what bounds how
// long a client keeps a list from before a rollout: five minutes, short
// against a rollout and long against the seconds between an agent's calls.
//
// resources/read (a sandbox's logs, private to its owner and changing with
// every command) and anything else keep ttlMs 0 and "private".
const ListCacheTTL = 5 * time.Minute

// cacheHints are the server options that set the hints above.
func cacheHints() []server.ServerOption {
	ttl := ListCacheTTL.Milliseconds()
	opts := []server.ServerOption{server.WithCacheHints(0, mcp.CacheScopePrivate)}
	for _, m := range []mcp.MCPMethod{mcp.MethodToolsList, mcp.MethodResourcesList, mcp.MethodResourcesTemplatesList, mcp.MethodServerDiscover} {
		opts = append(opts, server.WithMethodCacheHints(m, ttl, mcp.CacheScopePublic))
	}
	return opts
}

// deps is what every tool handler closes over.
type deps struct {
	cfg     Config
	backend contract.Backend
	log     *slog.Logger
}

// New builds the MCP server with every tool and the logs resource. The
// transports (package transport) put the caller's identity in the
// context; a request without one is refused.
func New(cfg Config, backend contract.Backend, logger *slog.Logger) (*server.MCPServer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &deps{cfg: cfg.withDefaults(), backend: backend, log: logger}
	version := cfg.Version
	if version == "" {
		version = "dev"
	}
	s := server.NewMCPServer(ServerName, version, append([]server.ServerOption{
		server.WithToolCapabilities(false),
		server.WithResourceCapabilities(false, false),
		server.WithLogging(),
		server.WithInstructions(fmt.Sprintf(instructions, defaultParenthesized(cfg.SandboxWorkingDir))),
		// The Tasks extension (MCP 2026-07-28): advertised in
		// server/discover, its methods answered by the transports.
		tasks.Option(taskSource{d}),
	}, cacheHints()...)...)
	for _, ctor := range append([]func(*deps) (mcp.Tool, server.ToolHandlerFunc){
		sandboxInitializeTool,
		copyProjectTool,
		writeFileTool,
		sandboxExecTool,
		execPollTool,
		execWaitTool,
		execKillTool,
		execWriteStdinTool,
		execListTool,
		copyFileTool,
		copyFileFromSandboxTool,
		readFileTool,
		listSandboxesTool,
		sandboxStopTool,
	}, append(append(portTools(d), snapshotTools(d)...), metricsTools(d)...)...) {
		tool, handler := ctor(d)
		s.AddTool(tool, d.wrap(tool.Name, handler))
	}
	tmpl, handler := logsResource(d)
	s.AddResourceTemplate(tmpl, handler)
	return s, nil
}

// wrap makes every handler fail closed without an identity, turns panics
// into tool errors (one bad call must not take the server and everyone's
// sandboxes down), and logs each call to stderr.
func (d *deps) wrap(name string, h server.ToolHandlerFunc) server.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (res *mcp.CallToolResult, err error) {
		caller, ok := contract.CallerFrom(ctx)
		if !ok {
			return mcp.NewToolResultError("unauthenticated request: no caller identity"), nil
		}
		if s := server.ClientSessionFromContext(ctx); s != nil && caller.Session == "" {
			caller.Session = s.SessionID()
		}
		ctx = contract.WithCaller(ctx, caller)
		start := time.Now()
		defer func() {
			if p := recover(); p != nil {
				d.log.Error("tool panicked", "tool", name, "panic", p, "stack", string(debug.Stack()))
				res, err = mcp.NewToolResultError(fmt.Sprintf("internal error in %s; the server logged the details", name)), nil
			}
			attrs := []any{"tool", name, "caller", contract.IdentityHash(caller.ID), "duration", time.Since(start).Round(time.Millisecond)}
			if res != nil && res.IsError {
				attrs = append(attrs, "error", firstText(res))
			}
			d.log.Info("tool call", attrs...)
		}()
		return h(ctx, req)
	}
}

func firstText(res *mcp.CallToolResult) string { return Truncate(resultText(res), 300) }

// resultText is the text of a tool result: its text contents, one per line
// (the tools write one). Results are read through it, never by asserting
// the type of Content[0].
func resultText(res *mcp.CallToolResult) string {
	var text []string
	for _, c := range res.Content {
		if t, ok := c.(mcp.TextContent); ok {
			text = append(text, t.Text)
		}
	}
	return strings.Join(text, "\n")
}

// toolError turns an error into a tool result that tells the caller what
// went wrong and what to do about it.
func (d *deps) toolError(containerID string, err error) *mcp.CallToolResult {
	msg := err.Error()
	switch {
	case errors.Is(err, errArgs):
		msg = "Invalid arguments: " + strings.TrimPrefix(msg, errArgs.Error()+": ")
	case errors.Is(err, contract.ErrNotFound):
		msg = fmt.Sprintf("Sandbox %q not found: it does not exist, belongs to another client, or was removed (stopped, idle too long, or past its lifetime). Call list_sandboxes to see yours, or sandbox_initialize to create a new one.", containerID)
	case errors.Is(err, contract.ErrSnapshotNotFound):
		msg += ": it does not exist, belongs to another client, or was deleted. Call list_snapshots to see yours."
	case errors.Is(err, contract.ErrQuota):
		msg += ". Stop a sandbox you no longer need with sandbox_stop (list_sandboxes shows yours), or, if the limit reached is CPU or memory, ask for less."
	case errors.Is(err, contract.ErrImageNotFound):
		msg += ". Use an image that is present where sandboxes run, or have it made available there (with the Docker backend, `docker pull IMAGE` or build it on the host, unless the server's pull policy pulls it; on Kubernetes, the nodes must have it or be able to pull it)."
	case errors.Is(err, contract.ErrUnavailable):
		msg += ". The sandbox backend (the Docker Engine, or the Kubernetes API, its admission webhook and the sandbox's node) is not reachable or not ready right now; retry in a moment."
	case errors.Is(err, contract.ErrNotRunning):
		msg += ". The sandbox is no longer running (it may have run out of memory); stop it with sandbox_stop and create a new one."
	case errors.Is(err, execio.ErrTooLarge):
		msg += ". Move less data at once, or split it."
	case errors.Is(err, execio.ErrInvalidPath), errors.Is(err, execio.ErrPathNotFound),
		errors.Is(err, execio.ErrInvalidRequest), errors.Is(err, execio.ErrUnsupportedEntry), errors.Is(err, contract.ErrInvalid),
		errors.Is(err, execio.ErrProcessNotFound), errors.Is(err, execio.ErrTooManyProcesses), errors.Is(err, execio.ErrProcessExited):
	case errors.Is(err, context.Canceled):
		msg = "The request was cancelled."
	case errors.Is(err, context.DeadlineExceeded):
		msg = "The request took too long and was abandoned: " + msg
	default:
		d.log.Warn("tool failed", "container_id", containerID, "error", err)
		msg = "Internal error: " + msg
	}
	return mcp.NewToolResultError(msg)
}

// result is a successful tool result with both forms: text for models and
// clients that read only text, structured content for those that parse.
func result(structured any, text string) *mcp.CallToolResult {
	return mcp.NewToolResultStructured(structured, text)
}

func boolPtr(b bool) *bool { return &b }

func annotations(title string, readOnly, destructive, idempotent, openWorld bool) mcp.ToolOption {
	return mcp.WithToolAnnotation(mcp.ToolAnnotation{
		Title:           title,
		ReadOnlyHint:    boolPtr(readOnly),
		DestructiveHint: boolPtr(destructive),
		IdempotentHint:  boolPtr(idempotent),
		OpenWorldHint:   boolPtr(openWorld),
	})
}
