// Command code-sandbox-mcp is a Model Context Protocol server that gives AI
// agents disposable, hardened code sandboxes. It is a drop-in replacement
// for the code-sandbox-mcp tools (sandbox_initialize, copy_project,
// write_file, sandbox_exec, copy_file, sandbox_stop and the
// containers://{id}/logs resource) with more of them, and a security model:
// see docs/mcp.md. Its wiring is internal/mcpserver/mcpmain's.
package main

import (
	"os"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/mcpmain"
)

func main() {
	os.Exit(mcpmain.Run(os.Args[1:]))
}
