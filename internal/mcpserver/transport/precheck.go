package transport

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
)

// The bounds a JSON-RPC message must keep before anything decodes it.
//
// mcp-go decodes a tools/call's arguments into an any (every string an
// interface, every array a []any) and the tool binds them again; a 17 MiB
// body of 100,000-element arrays cost about 300 MB that way. precheck walks
// the raw message once, token by token, without building it, and refuses it
// as soon as it breaks one of these, so what the decoders later build is
// bounded by the message's size and these counts.
const (
	// DefaultMaxMessageBytes caps a message that is not a call of one of
	// the large-body tools (write_file): every other tool's arguments are
	// short (sandbox_exec's commands included), and so are the protocol's
	// own messages.
	DefaultMaxMessageBytes = int64(2 << 20)
	// MaxJSONDepth bounds the nesting of a message.
	MaxJSONDepth = 32
	// MaxJSONValues bounds the values and object keys in one message.
	MaxJSONValues = 10000
)

// LargeBodyTools are the tools whose calls may be up to the transport's
// MaxBodyBytes; every other message is held to MaxMessageBytes.
var LargeBodyTools = []string{"write_file"}

// messageInfo is what precheck learned about a message on the way.
type messageInfo struct {
	// Method is the JSON-RPC method ("" for a response).
	Method string
	// Tool is a tools/call's params.name.
	Tool string
	// ID is the request's id as JSON (nil when it has none, or it is not a
	// string, number or null).
	ID json.RawMessage
}

func (m messageInfo) isToolCall() bool { return m.Method == "tools/call" }

// precheckError is a message precheck refuses, with the HTTP status and
// JSON-RPC code to answer it with.
type precheckError struct {
	status  int
	code    int
	message string
}

func (e *precheckError) Error() string { return e.message }

const (
	jsonrpcParseError     = -32700
	jsonrpcInvalidRequest = -32600
)

func tooLarge(what string, limit int64) *precheckError {
	return &precheckError{status: http.StatusRequestEntityTooLarge, code: jsonrpcInvalidRequest,
		message: fmt.Sprintf("Request Entity Too Large: %s is over its limit of %d bytes", what, limit)}
}

func badMessage(format string, args ...any) *precheckError {
	return &precheckError{status: http.StatusBadRequest, code: jsonrpcInvalidRequest, message: "Bad Request: " + fmt.Sprintf(format, args...)}
}

// messageLimits are the caps precheck applies.
type messageLimits struct {
	// MaxBodyBytes caps a call of one of LargeBodyTools; MaxMessageBytes
	// every other message.
	MaxBodyBytes    int64
	MaxMessageBytes int64
}

// capFor is the size cap of a message whose method and tool are known so
// far (either may still be "").
func (l messageLimits) capFor(info messageInfo) int64 {
	if info.Method != "" && !info.isToolCall() {
		return l.MaxMessageBytes
	}
	if info.Tool != "" && !slices.Contains(LargeBodyTools, info.Tool) {
		return l.MaxMessageBytes
	}
	return l.MaxBodyBytes
}

// errCapped is what cappedReader returns past its limit.
var errCapped = errors.New("message over its size limit")

// cappedReader counts what it reads and fails once more than limit bytes
// have come through; limit may be lowered while reading.
type cappedReader struct {
	r     io.Reader
	n     int64
	limit int64
}

func (c *cappedReader) Read(p []byte) (int, error) {
	if c.n > c.limit {
		return 0, errCapped
	}
	if room := c.limit + 1 - c.n; int64(len(p)) > room {
		p = p[:room]
	}
	k, err := c.r.Read(p)
	c.n += int64(k)
	if c.n > c.limit {
		return k, errCapped
	}
	return k, err
}

type jsonFrame struct {
	object    bool
	path      string
	expectKey bool
	key       string
	n         int
}

// precheck reads one JSON-RPC message from r and walks it token by token,
// never holding more than one token decoded: it refuses a message that is
// not one JSON object, is nested deeper than MaxJSONDepth, holds more than
// MaxJSONValues values, gives sandbox_exec more than mcpserver.MaxCommandsPerExec
// commands, or is longer than its cap (see messageLimits.capFor: the cap
// drops as soon as the method or tool name is read, wherever they are in
// the message). It returns the message's bytes (read once, kept for the
// handler that decodes it) and what it learned.
func precheck(r io.Reader, limits messageLimits) ([]byte, messageInfo, *precheckError) {
	var info messageInfo
	var buf bytes.Buffer
	cr := &cappedReader{r: r, limit: limits.MaxBodyBytes}
	dec := json.NewDecoder(io.TeeReader(cr, &buf))
	dec.UseNumber()
	fail := func(err error) *precheckError {
		if errors.Is(err, errCapped) || cr.n > cr.limit {
			what := "this message"
			switch {
			case info.Tool != "":
				what = "a call of " + mcpserver.Truncate(info.Tool, 40)
			case info.Method != "":
				what = "this " + mcpserver.Truncate(info.Method, 40) + " message"
			}
			return tooLarge(what, cr.limit)
		}
		if isMaxBytesError(err) {
			return tooLarge("this message", limits.MaxBodyBytes)
		}
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return &precheckError{status: http.StatusBadRequest, code: jsonrpcParseError, message: "Bad Request: the message ends before its JSON does"}
		}
		return &precheckError{status: http.StatusBadRequest, code: jsonrpcParseError, message: "Bad Request: the message is not valid JSON: " + mcpserver.Truncate(err.Error(), 200)}
	}
	var stack []jsonFrame
	values := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil, info, fail(err)
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				break
			}
			if top := &stack[len(stack)-1]; top.object {
				top.expectKey = true
			}
			continue
		}
		if values++; values > MaxJSONValues {
			return nil, info, badMessage("the message holds more than %d JSON values", MaxJSONValues)
		}
		var top *jsonFrame
		if len(stack) > 0 {
			top = &stack[len(stack)-1]
		}
		if top != nil && top.object && top.expectKey {
			top.key, _ = tok.(string)
			top.expectKey = false
			continue
		}
		path := ""
		switch {
		case top == nil:
			if d, ok := tok.(json.Delim); !ok || d != '{' {
				return nil, info, badMessage("a message must be one JSON-RPC object (batches are not supported)")
			}
		case top.object:
			path = top.path + "/" + top.key
			top.expectKey = true
		default:
			path = top.path + "/"
			if top.n++; top.path == "/params/arguments/commands" && top.n > mcpserver.MaxCommandsPerExec {
				return nil, info, badMessage("more than %d commands in one call; the limit is %d", mcpserver.MaxCommandsPerExec, mcpserver.MaxCommandsPerExec)
			}
		}
		if d, ok := tok.(json.Delim); ok {
			if len(stack) >= MaxJSONDepth {
				return nil, info, badMessage("the message is nested more than %d levels deep", MaxJSONDepth)
			}
			stack = append(stack, jsonFrame{object: d == '{', path: path, expectKey: d == '{'})
			continue
		}
		switch path {
		case "/method":
			info.Method, _ = tok.(string)
		case "/params/name":
			info.Tool, _ = tok.(string)
		case "/id":
			switch tok.(type) {
			case string, json.Number, nil:
				info.ID, _ = json.Marshal(tok)
			}
		default:
			continue
		}
		// The method or tool is known: the cap may drop at once.
		if cr.limit = limits.capFor(info); cr.n > cr.limit {
			return nil, info, fail(errCapped)
		}
	}
	// Nothing but white space may follow the message.
	if _, err := dec.Token(); err == nil {
		return nil, info, badMessage("a message must be one JSON-RPC object; more follows it")
	} else if err != io.EOF {
		return nil, info, fail(err)
	}
	return buf.Bytes(), info, nil
}

func isMaxBytesError(err error) bool {
	var mbe *http.MaxBytesError
	return errors.As(err, &mbe)
}
