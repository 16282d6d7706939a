package transport

import (
	"bytes"
	"context"
	"io"
	"net/http"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/tasks"
)

// The Tasks extension (package tasks) on both transports: its methods are
// answered here before mcp-go sees them (mcp-go knows none of them), and a
// tool's CreateTaskResult, which mcp-go can only carry as a marked
// CallToolResult, is rewritten on its way out. Both happen only for
// requests of MCP 2026-07-28 or later; anything else reaches mcp-go, and
// the client, unchanged.

// serveTask answers a task method over HTTP. The body was bounded and read
// by limitBody; the caller was authenticated and rate-limited before.
func serveTask(ts *tasks.Server, w http.ResponseWriter, r *http.Request, body []byte) {
	caller, _ := contract.CallerFrom(r.Context())
	out, code := ts.Handle(r.Context(), caller, body, r.Header)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(tasks.HTTPStatus(code))
	_, _ = w.Write(append(out, '\n'))
}

// taskResultWriter rewrites the response of a tools/call that declared the
// extension (tasks.Rewrite): a JSON body once it is complete, an SSE
// stream event by event (progress notifications pass as they come).
type taskResultWriter struct {
	w      http.ResponseWriter
	status int
	sse    bool
	buf    bytes.Buffer
}

func (t *taskResultWriter) Header() http.Header { return t.w.Header() }

func (t *taskResultWriter) WriteHeader(code int) {
	if t.status != 0 {
		return
	}
	t.status = code
	t.sse = bytes.HasPrefix([]byte(t.w.Header().Get("Content-Type")), []byte("text/event-stream"))
	if t.sse {
		t.w.WriteHeader(code)
	}
}

func (t *taskResultWriter) Write(p []byte) (int, error) {
	if t.status == 0 {
		t.WriteHeader(http.StatusOK)
	}
	t.buf.Write(p)
	if !t.sse {
		return len(p), nil
	}
	for {
		event, rest, ok := bytes.Cut(t.buf.Bytes(), []byte("\n\n"))
		if !ok {
			return len(p), nil
		}
		if _, err := t.w.Write(append(rewriteEvent(event), '\n', '\n')); err != nil {
			return len(p), err
		}
		t.buf.Next(len(t.buf.Bytes()) - len(rest))
	}
}

// Flush makes mcp-go see a writer that can stream.
func (t *taskResultWriter) Flush() {
	if f, ok := t.w.(http.Flusher); ok && t.sse {
		f.Flush()
	}
}

// finish writes what is held back: the whole JSON body, or the end of an
// SSE stream that lacked its last blank line.
func (t *taskResultWriter) finish() {
	if t.status == 0 {
		return
	}
	if t.sse {
		if t.buf.Len() > 0 {
			_, _ = t.w.Write(rewriteEvent(t.buf.Bytes()))
		}
		return
	}
	body := bytes.TrimRight(t.buf.Bytes(), "\n")
	if out, ok := tasks.Rewrite(body); ok {
		body = append(out, '\n')
		t.w.Header().Del("Content-Length")
	} else {
		body = t.buf.Bytes()
	}
	t.w.WriteHeader(t.status)
	_, _ = t.w.Write(body)
}

// rewriteEvent rewrites the data line of one SSE event.
func rewriteEvent(event []byte) []byte {
	var out bytes.Buffer
	for line := range bytes.Lines(event) {
		trimmed := bytes.TrimRight(line, "\r\n")
		if data, ok := bytes.CutPrefix(trimmed, []byte("data: ")); ok {
			if rewritten, ok := tasks.Rewrite(data); ok {
				out.WriteString("data: ")
				out.Write(rewritten)
				out.Write(line[len(trimmed):])
				continue
			}
		}
		out.Write(line)
	}
	return out.Bytes()
}

// stdioTaskWriter rewrites the CreateTaskResults among the messages mcp-go
// writes over stdio, one message (and its newline) per Write.
type stdioTaskWriter struct{ w io.Writer }

func (s stdioTaskWriter) Write(p []byte) (int, error) {
	if out, ok := tasks.Rewrite(bytes.TrimRight(p, "\n")); ok {
		if _, err := s.w.Write(append(out, '\n')); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return s.w.Write(p)
}

// stdioTasks answers the task methods of a stdio client (LocalIdentity),
// each on its own goroutine (a tasks/get asks the sandbox), at most
// stdioWorkers at once.
type stdioTasks struct {
	ctx   context.Context
	ts    *tasks.Server
	reply io.Writer
	slots chan struct{}
}

// intercept answers body when it is a task method of MCP 2026-07-28, and
// reports whether it did.
func (s *stdioTasks) intercept(body []byte, info messageInfo) bool {
	if s == nil || !tasks.IsMethod(info.Method) || !tasks.Modern(body) {
		return false
	}
	select {
	case s.slots <- struct{}{}:
	case <-s.ctx.Done():
		return true
	}
	body = bytes.Clone(body)
	go func() {
		defer func() { <-s.slots }()
		out, _ := s.ts.Handle(s.ctx, contract.Caller{ID: contract.LocalIdentity, Session: "stdio"}, body, nil)
		_, _ = s.reply.Write(append(out, '\n'))
	}()
	return true
}
