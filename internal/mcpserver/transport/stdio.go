package transport

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/tasks"

	"github.com/mark3labs/mcp-go/server"
)

// stdioWorkers is how many tool calls run at once over stdio; a long
// sandbox_exec must not hold up list_sandboxes.
const stdioWorkers = 16

// ServeStdio serves one local client over in/out until in reaches EOF or
// ctx ends. out carries nothing but JSON-RPC; the server's own logs go to
// logger. The client is LocalIdentity.
//
// mcp-go reads a whole line before it decodes it, however long it is, and
// decodes a tool's arguments twice; so every line goes through
// boundedLines first, which holds it to the HTTP transport's caps
// (DefaultMaxBodyBytes for write_file, DefaultMaxMessageBytes for the rest,
// and precheck's counts) and answers a line it refuses itself.
func ServeStdio(ctx context.Context, s *server.MCPServer, in io.Reader, out io.Writer, logger *slog.Logger) error {
	ss := server.NewStdioServer(s)
	server.WithWorkerPoolSize(stdioWorkers)(ss)
	ss.SetErrorLogger(slog.NewLogLogger(logger.Handler(), slog.LevelError))
	ss.SetContextFunc(func(ctx context.Context) context.Context {
		return contract.WithCaller(ctx, contract.Caller{ID: contract.LocalIdentity, Session: "stdio"})
	})
	w := &lockedWriter{w: out}
	pr, pw := io.Pipe()
	limits := messageLimits{MaxBodyBytes: DefaultMaxBodyBytes, MaxMessageBytes: DefaultMaxMessageBytes}
	var st *stdioTasks
	var mcpOut io.Writer = w
	if ts := tasks.For(s); ts != nil {
		st = &stdioTasks{ctx: ctx, ts: ts, reply: w, slots: make(chan struct{}, stdioWorkers)}
		mcpOut = stdioTaskWriter{w: w}
	}
	go func() {
		pw.CloseWithError(boundedLines(in, pw, w, limits, logger, st.intercept))
	}()
	defer pr.Close()
	return ss.Listen(ctx, pr, mcpOut)
}

// lockedWriter serializes whole writes: mcp-go writes each message with
// one Write, and so does boundedLines, so messages never interleave.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// boundedLines copies the lines of in that pass precheck to pass, and
// answers every other line on reply with a JSON-RPC error. precheck reads
// a line as it arrives, so a line is refused as soon as it breaks a cap,
// and the rest of it is skipped unread into memory.
//
// intercept, when not nil, may answer a line itself (the Tasks extension's
// methods) and report that it did; the line then does not reach pass.
func boundedLines(in io.Reader, pass io.Writer, reply io.Writer, limits messageLimits, logger *slog.Logger, intercept func([]byte, messageInfo) bool) error {
	br := bufio.NewReaderSize(in, 64<<10)
	for {
		// Blank lines and the white space between messages are no
		// messages.
		c, err := br.ReadByte()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if c == ' ' || c == '\t' || c == '\r' || c == '\n' {
			continue
		}
		_ = br.UnreadByte()
		lr := &lineReader{br: br}
		body, info, perr := precheck(lr, limits)
		if lr.err != nil {
			return lr.err
		}
		if perr == nil && !lr.done {
			// precheck stopped at the end of the JSON; only the newline
			// may be left.
			if _, err := lr.drain(); err != nil {
				return err
			}
		}
		if perr != nil {
			refuseLine(reply, perr, info.ID, logger)
			if _, err := lr.drain(); err != nil {
				return err
			}
			continue
		}
		if intercept != nil && intercept(body, info) {
			continue
		}
		if len(body) == 0 || body[len(body)-1] != '\n' {
			body = append(body, '\n')
		}
		if _, err := pass.Write(body); err != nil {
			return err
		}
	}
}

// lineReader reads one line (up to and including its newline) of br, then
// reports io.EOF. err is a read error other than io.EOF.
type lineReader struct {
	br   *bufio.Reader
	done bool
	err  error
}

func (l *lineReader) Read(p []byte) (int, error) {
	if l.done || len(p) == 0 {
		return 0, io.EOF
	}
	if _, err := l.br.Peek(1); err != nil {
		l.done = true
		if err != io.EOF {
			l.err = err
		}
		return 0, err
	}
	buf, _ := l.br.Peek(min(len(p), l.br.Buffered()))
	if i := bytes.IndexByte(buf, '\n'); i >= 0 {
		buf = buf[:i+1]
		l.done = true
	}
	n := copy(p, buf)
	_, _ = l.br.Discard(n)
	return n, nil
}

// drain skips the rest of the line.
func (l *lineReader) drain() (int64, error) {
	n, _ := io.Copy(io.Discard, l)
	return n, l.err
}

func refuseLine(w io.Writer, e *precheckError, id []byte, logger *slog.Logger) {
	logger.Info("refused a message before decoding it", "reason", e.message)
	if len(id) == 0 {
		id = []byte("null")
	}
	msg, _ := json.Marshal(e.message)
	_, _ = fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":%d,"message":%s}}`+"\n", id, e.code, msg)
}
