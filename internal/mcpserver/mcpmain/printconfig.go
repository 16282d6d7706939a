package mcpmain

// The config subcommand: client configuration snippets.

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/transport"
)

// PrintClientConfig prints client configuration snippets to w: the stdio
// form with this binary's absolute path and serverArgs (the server flags
// given after "config", less --http), and the HTTP form of o's endpoint.
// It returns the process's exit code.
func PrintClientConfig(w io.Writer, o Config, serverArgs []string) int {
	exe, err := os.Executable()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot determine the binary's path:", err)
		return 1
	}
	if serverArgs == nil {
		serverArgs = []string{}
	}
	endpoint := o.PublicURL
	if endpoint == "" {
		addr := o.HTTPAddr
		if addr == "" {
			addr = "127.0.0.1:8080"
		}
		endpoint = "http://" + addr + transport.EndpointPath
	}
	httpServer := map[string]any{
		"type":    "http",
		"url":     endpoint,
		"headers": map[string]string{"Authorization": "Bearer <token from --token-file>"},
	}
	httpHint := fmt.Sprintf("start the server with --http %s --auth token --token-file FILE", strings.TrimSuffix(strings.TrimPrefix(endpoint, "http://"), transport.EndpointPath))
	if o.Auth == "oidc" {
		// An OAuth client finds the issuer through the 401's
		// resource_metadata and gets its own token: it needs only the URL.
		delete(httpServer, "headers")
		httpHint = "a client that speaks OAuth needs only the URL; it finds --oidc-issuer-url through the protected resource metadata"
	}
	out := map[string]any{
		"stdio": map[string]any{
			"mcpServers": map[string]any{
				"code-sandbox": map[string]any{"command": exe, "args": serverArgs},
			},
		},
		"http": map[string]any{
			"mcpServers": map[string]any{
				"code-sandbox": httpServer,
			},
		},
	}
	// Explanations go to stderr so that stdout is one JSON document.
	fmt.Fprintln(os.Stderr, `"stdio": for Claude Desktop (claude_desktop_config.json) and other clients that start the server themselves.`)
	fmt.Fprintf(os.Stderr, "\"http\": for clients that speak streamable HTTP; %s.\n", httpHint)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		return 1
	}
	return 0
}
