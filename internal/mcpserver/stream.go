package mcpserver

import (
	"context"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// streamInterval is how often buffered output goes out as notifications.
// Coalescing matters: a transport queues at most 100 notifications per
// session and drops the rest, and `yes` writes far faster than that.
const streamInterval = 50 * time.Millisecond

// streamChunkMax bounds one notification's text.
const streamChunkMax = 16 << 10

// outputStreamer forwards a tool call's command output to the client while
// it runs: as notifications/progress when the request carried a progress
// token, and as notifications/message (logger "sandbox_exec", level info)
// subject to the client's logging level. The final tool result carries the
// complete output either way; notifications are a live view.
type outputStreamer struct {
	ctx         context.Context
	srv         *server.MCPServer
	token       mcp.ProgressToken
	containerID string

	mu       sync.Mutex
	index    int
	command  string
	pending  [2][]byte // stdout, stderr
	progress float64

	stop chan struct{}
	done chan struct{}
}

func newOutputStreamer(ctx context.Context, req mcp.CallToolRequest, containerID string) *outputStreamer {
	s := &outputStreamer{
		ctx:         ctx,
		srv:         server.ServerFromContext(ctx),
		containerID: containerID,
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
	}
	if req.Params.Meta != nil {
		s.token = req.Params.Meta.ProgressToken
	}
	go s.loop()
	return s
}

// begin starts a new command; output of the previous one is flushed first.
func (s *outputStreamer) begin(index int, command string) {
	s.flush()
	s.mu.Lock()
	s.index, s.command = index, command
	s.mu.Unlock()
}

// write is the Backend's OutputFunc.
func (s *outputStreamer) write(stream string, p []byte) {
	i := 0
	if stream == "stderr" {
		i = 1
	}
	s.mu.Lock()
	// Output beyond a chunk per interval is dropped from the live view
	// only; the result keeps it (up to the output cap).
	if room := 4*streamChunkMax - len(s.pending[i]); room > 0 {
		s.pending[i] = append(s.pending[i], p[:min(len(p), room)]...)
	}
	s.mu.Unlock()
}

func (s *outputStreamer) loop() {
	defer close(s.done)
	t := time.NewTicker(streamInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.flush()
		case <-s.stop:
			return
		case <-s.ctx.Done():
			return
		}
	}
}

// close flushes what is left and stops the loop.
func (s *outputStreamer) close() {
	close(s.stop)
	<-s.done
	s.flush()
}

func (s *outputStreamer) flush() {
	if s.srv == nil {
		return
	}
	s.mu.Lock()
	type chunk struct {
		stream string
		text   string
	}
	var chunks []chunk
	for i, name := range []string{"stdout", "stderr"} {
		buf := s.pending[i]
		n := completeUTF8(buf)
		for n > 0 {
			m := min(n, streamChunkMax)
			m = completeUTF8(buf[:m])
			if m == 0 {
				m = min(n, streamChunkMax)
			}
			chunks = append(chunks, chunk{name, string(buf[:m])})
			buf, n = buf[m:], n-m
		}
		s.pending[i] = append(s.pending[i][:0], buf...)
	}
	index, command := s.index, s.command
	for _, c := range chunks {
		s.progress += float64(len(c.text))
		if s.token != nil {
			_ = s.srv.SendNotificationToClient(s.ctx, string(mcp.MethodNotificationProgress), map[string]any{
				"progressToken": s.token,
				"progress":      s.progress,
				"message":       c.text,
			})
		}
		_ = s.srv.SendLogMessageToClient(s.ctx, mcp.NewLoggingMessageNotification(mcp.LoggingLevelInfo, "sandbox_exec", map[string]any{
			"container_id":  s.containerID,
			"command_index": index,
			"command":       Truncate(command, 200),
			"stream":        c.stream,
			"text":          c.text,
		}))
	}
	s.mu.Unlock()
}

// completeUTF8 is the length of b without a trailing incomplete UTF-8
// sequence, so a character split across two writes is sent whole. Invalid
// bytes are left for JSON encoding to replace.
func completeUTF8(b []byte) int {
	for back := 1; back <= utf8.UTFMax && back <= len(b); back++ {
		i := len(b) - back
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return i
			}
			return len(b)
		}
	}
	return len(b)
}
