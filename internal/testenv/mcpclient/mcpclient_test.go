/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package mcpclient

import (
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func TestTextJoinsTextContentsOnly(t *testing.T) {
	res := &mcp.CallToolResult{Content: []mcp.Content{
		&mcp.ImageContent{MIMEType: "image/png", Data: []byte("png")},
		&mcp.TextContent{Text: "sandbox "},
		&mcp.TextContent{Text: "not found"},
	}}
	if got := Text(res); got != "sandbox not found" {
		t.Errorf("Text = %q, want %q", got, "sandbox not found")
	}
	if got := Text(&mcp.CallToolResult{}); got != "" {
		t.Errorf("Text of an empty result = %q, want empty", got)
	}
}
