/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package mcpclient holds what the suites that drive the MCP server through
// the official SDK (the tests' client) share.
package mcpclient

import (
	"context"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
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

// Bearer is an http.RoundTripper that adds an Authorization header with
// Token to every request and sends it through Base.
type Bearer struct {
	Token string
	Base  http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (b Bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.Token)
	return b.Base.RoundTrip(r)
}

// Call invokes a tool and returns its result. A protocol error fails the
// spec: every tool must answer, even bad input, with a tool result.
func Call(ctx context.Context, s *mcp.ClientSession, name string, args map[string]any) *mcp.CallToolResult {
	GinkgoHelper()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	Expect(err).NotTo(HaveOccurred(), "calling %s", name)
	return res
}

// Structured is a tool result's structured content, which every tool of
// the server returns as an object.
func Structured(res *mcp.CallToolResult) map[string]any {
	GinkgoHelper()
	m, ok := res.StructuredContent.(map[string]any)
	Expect(ok).To(BeTrue(), "structured content is %T: %s", res.StructuredContent, Text(res))
	return m
}

// Initialize calls sandbox_initialize with args (nil: the server's
// defaults), expects a sandbox, and returns its container_id.
func Initialize(ctx context.Context, s *mcp.ClientSession, args map[string]any) string {
	GinkgoHelper()
	if args == nil {
		args = map[string]any{}
	}
	res := Call(ctx, s, "sandbox_initialize", args)
	Expect(res.IsError).To(BeFalse(), Text(res))
	id, _ := Structured(res)["container_id"].(string)
	Expect(id).NotTo(BeEmpty())
	return id
}
