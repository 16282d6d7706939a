package mcpserver

import (
	"context"
	"io"
	"log/slog"

	"github.com/mark3labs/mcp-go/server"
)

// stdioWorkers is how many tool calls run at once over stdio; a long
// sandbox_exec must not hold up list_sandboxes.
const stdioWorkers = 16

// ServeStdio serves one local client over in/out until in reaches EOF or
// ctx ends. out carries nothing but JSON-RPC; the server's own logs go to
// logger. The client is LocalIdentity.
func ServeStdio(ctx context.Context, s *server.MCPServer, in io.Reader, out io.Writer, logger *slog.Logger) error {
	ss := server.NewStdioServer(s)
	server.WithWorkerPoolSize(stdioWorkers)(ss)
	ss.SetErrorLogger(slog.NewLogLogger(logger.Handler(), slog.LevelError))
	ss.SetContextFunc(func(ctx context.Context) context.Context {
		return WithCaller(ctx, Caller{ID: LocalIdentity, Session: "stdio"})
	})
	return ss.Listen(ctx, in, out)
}
