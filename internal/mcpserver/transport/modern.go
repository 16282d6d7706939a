package transport

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/tasks"
)

// MCP 2026-07-28 (the stateless revision) beside the session-based ones.
//
// mcp-go serves both on the one endpoint and decides a request's revision
// from its Mcp-Protocol-Version header and its _meta; it validates the
// Mcp-Method and Mcp-Name headers against the body, answers server/discover
// and puts the cache hints on lists (see mcpserver.New). What is here
// covers two places where it falls short of what clients need; both run
// after limitBody, on a body precheck has already bounded and read.

// modernVersion reports the 2026-07-28-or-later revision a request's
// Mcp-Protocol-Version header names, or "" for a session-based one. An
// unknown version is not modern here: mcp-go answers it with
// UnsupportedProtocolVersionError, which lists the versions it serves.
func modernVersion(r *http.Request) string {
	v := r.Header.Get(mcp.HeaderProtocolVersion)
	if mcp.IsValidProtocolVersion(v) && mcp.IsModernProtocol(v) {
		return v
	}
	return ""
}

// modernRequests answers what 2026-07-28 removed, before mcp-go sees it.
//
// ping is gone from 2026-07-28 (SEP-2575), and a server MUST answer a
// method it does not implement with 404 and JSON-RPC -32601. mcp-go does
// so only for a ping that carries the per-request _meta, which no client
// sends on a ping: the official Go SDK (v1.8.0) sends its ping, by hand or
// from ClientOptions.KeepAlive, with only the Mcp-Protocol-Version header,
// and mcp-go answered that with 400 "missing or invalid _meta field". The
// SDK treats 400 as a failed ping (its keep-alive closes the session after
// KeepAliveFailureThreshold of them) and -32601 as "the peer has no ping"
// (its keep-alive stops and the session lives on), so -32601 is both what
// the revision says and what lets the client recover.
//
// notifications/cancelled is accepted whatever its _meta (see below), and
// subscriptions/listen is wrapped by listenWriter, below. The Tasks
// extension's methods are answered by package tasks (tasks.go).
func (h *HTTPServer) modernRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buffered, ok := r.Body.(*bufferedBody)
		version := modernVersion(r)
		if r.Method != http.MethodPost || !ok || version == "" {
			next.ServeHTTP(w, r)
			return
		}
		switch buffered.info.Method {
		case string(mcp.MethodPing):
			writeJSONRPCError(w, &precheckError{status: http.StatusNotFound, code: mcp.METHOD_NOT_FOUND,
				message: fmt.Sprintf("Method not found: ping is not part of MCP %s (SEP-2575 removed it); a client that wants to know the server is up may call server/discover", version)},
				buffered.info.ID)
		case string(mcp.MethodNotificationCancelled):
			if len(buffered.info.ID) != 0 {
				next.ServeHTTP(w, r)
				return
			}
			// The Go SDK (v1.8.0) sends notifications/cancelled when a
			// call's context ends, with only the header version and no
			// _meta; mcp-go refused it with 400, and the SDK then failed
			// every later call of the connection. A 2026-07-28 call is
			// cancelled by closing its request (its context ends with it,
			// here as on any replica), and mcp-go acts on no cancelled
			// notification in either revision: accept it, as a notification
			// is accepted, and do nothing.
			w.WriteHeader(http.StatusAccepted)
		case string(mcp.MethodSubscriptionsListen):
			lw := &listenWriter{w: w}
			next.ServeHTTP(lw, r)
			lw.finish(r, buffered.info.ID)
		case tasks.MethodGet, tasks.MethodUpdate, tasks.MethodCancel:
			if h.tasks == nil {
				next.ServeHTTP(w, r)
				return
			}
			serveTask(h.tasks, w, r, buffered.data)
		case string(mcp.MethodToolsCall):
			// Only a call that declared the extension can be answered
			// with a task (see tasks.Declared).
			if h.tasks == nil || !tasks.RequestDeclares(buffered.data) {
				next.ServeHTTP(w, r)
				return
			}
			tw := &taskResultWriter{w: w}
			next.ServeHTTP(tw, r)
			tw.finish()
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// listenWriter works around a race in mcp-go v1.2.1's streamable HTTP
// server. subscriptions/listen first sends notifications/subscriptions/
// acknowledged, which MUST be the first message of the stream, and then,
// when the client subscribed to nothing this server can send (this server
// declares no listChanged and no resource subscriptions, so that is every
// time), returns its result at once. The acknowledgement goes through the
// request's notification forwarder; when the result wins the race for the
// response lock (often, on a busy machine) the forwarder drops the
// acknowledgement, and the client gets the result alone, as JSON or as an
// SSE stream of one event.
//
// listenWriter holds the response back until it has seen its first SSE
// event: if that is the acknowledgement, the stream goes through as it
// comes (so a long-lived listen stream would too). Otherwise, once mcp-go
// is done, it sends the acknowledgement, tagged with the subscription ID
// (the request's id), ahead of the result. An error answer (a header
// mismatch, say) goes out unchanged.
type listenWriter struct {
	w           http.ResponseWriter
	status      int
	passthrough bool
	buf         bytes.Buffer
}

const listenAckMethod = string(mcp.MethodNotificationSubscriptionsAcknowledged)

func (l *listenWriter) Header() http.Header { return l.w.Header() }

func (l *listenWriter) WriteHeader(code int) {
	if l.status == 0 {
		l.status = code
	}
}

func (l *listenWriter) isSSE() bool {
	return strings.HasPrefix(l.w.Header().Get("Content-Type"), "text/event-stream")
}

func (l *listenWriter) Write(p []byte) (int, error) {
	if l.status == 0 {
		l.status = http.StatusOK
	}
	if l.passthrough {
		return l.w.Write(p)
	}
	n, _ := l.buf.Write(p)
	if !l.isSSE() {
		return n, nil
	}
	events := sseData(l.buf.Bytes())
	if len(events) == 0 {
		return n, nil
	}
	if firstMethod(events[0]) == listenAckMethod {
		l.passthrough = true
		l.w.WriteHeader(l.status)
		_, err := l.w.Write(l.buf.Bytes())
		l.buf.Reset()
		return n, err
	}
	return n, nil
}

// Flush makes mcp-go see a writer that can stream (it checks for
// http.Flusher), so that it still upgrades to SSE when it can.
func (l *listenWriter) Flush() {
	if f, ok := l.w.(http.Flusher); ok && l.passthrough {
		f.Flush()
	}
}

// sseData returns the data of each complete event in an SSE body.
func sseData(body []byte) [][]byte {
	var out [][]byte
	for {
		event, rest, ok := bytes.Cut(body, []byte("\n\n"))
		if !ok {
			return out
		}
		for line := range bytes.Lines(event) {
			if data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data: ")); ok {
				out = append(out, data)
			}
		}
		body = rest
	}
}

func firstMethod(msg []byte) string {
	var m struct {
		Method string `json:"method"`
	}
	_ = json.Unmarshal(msg, &m)
	return m.Method
}

// listenAcknowledgement is the notification this server's listen stream
// opens with: it establishes none of the notification types a client may
// ask for, since it declares none.
func listenAcknowledgement(id json.RawMessage) ([]byte, error) {
	return json.Marshal(map[string]any{
		"jsonrpc": mcp.JSONRPC_VERSION,
		"method":  listenAckMethod,
		"params": map[string]any{
			"_meta":         map[string]any{mcp.MetaKeySubscriptionID: id},
			"notifications": map[string]any{},
		},
	})
}

func (l *listenWriter) finish(r *http.Request, id json.RawMessage) {
	if l.passthrough {
		return
	}
	if l.status == 0 {
		l.status = http.StatusOK
	}
	body := l.buf.Bytes()
	events := [][]byte{bytes.TrimSpace(body)}
	if l.isSSE() {
		events = sseData(body)
	}
	var last struct {
		Result json.RawMessage `json:"result"`
	}
	isResult := l.status == http.StatusOK && len(id) > 0 && len(events) > 0 &&
		json.Unmarshal(events[len(events)-1], &last) == nil && len(last.Result) > 0
	ack, err := listenAcknowledgement(id)
	if !isResult || err != nil || !strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		l.w.WriteHeader(l.status)
		_, _ = l.w.Write(body)
		return
	}
	hdr := l.w.Header()
	hdr.Del("Content-Length")
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	l.w.WriteHeader(http.StatusOK)
	for _, e := range append([][]byte{ack}, events...) {
		_, _ = fmt.Fprintf(l.w, "event: message\ndata: %s\n\n", e)
	}
}
