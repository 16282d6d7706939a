/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package mcpclient holds what the suites that drive the MCP server through
// the official SDK (the tests' client) share.
package mcpclient

import (
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Text is the text of a tool result: its text contents, concatenated.
// Suites read results through it, never by asserting the type of
// Content[0].
func Text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			b.WriteString(t.Text)
		}
	}
	return b.String()
}
