//go:build mcp_e2e && linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/mcpclient"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// wireRecord is one HTTP exchange the go-sdk client made.
type wireRecord struct {
	verb, method, version, mcpMethod, mcpName, sessionSent, sessionGot string
	status                                                             int
}

// wireLog records what the client sends and what it gets back, so that a
// spec can hold the client and the server to a revision's wire rules.
type wireLog struct {
	base http.RoundTripper
	mu   sync.Mutex
	recs []wireRecord
}

func (l *wireLog) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := wireRecord{verb: r.Method, version: r.Header.Get("MCP-Protocol-Version"), mcpMethod: r.Header.Get("Mcp-Method"),
		mcpName: r.Header.Get("Mcp-Name"), sessionSent: r.Header.Get("Mcp-Session-Id")}
	if r.Body != nil {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var m struct {
			Method string `json:"method"`
		}
		_ = json.Unmarshal(body, &m)
		rec.method = m.Method
	}
	resp, err := l.base.RoundTrip(r)
	if resp != nil {
		rec.status, rec.sessionGot = resp.StatusCode, resp.Header.Get("Mcp-Session-Id")
	}
	l.mu.Lock()
	l.recs = append(l.recs, rec)
	l.mu.Unlock()
	return resp, err
}

func (l *wireLog) records() []wireRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]wireRecord(nil), l.recs...)
}

// pings are the ping requests the client sent, with their statuses.
func (l *wireLog) pings() []int {
	var out []int
	for _, r := range l.records() {
		if r.method == "ping" {
			out = append(out, r.status)
		}
	}
	return out
}

// Both MCP revisions on the one HTTP endpoint, through the official Go SDK
// client held to each, with its keep-alive on.
var _ = Describe("code-sandbox-mcp over streamable HTTP in both MCP revisions", Ordered, func() {
	const keepAlive = 300 * time.Millisecond
	var srv *mcpServer

	BeforeAll(func() {
		tokens := writeTokenFile(tokenA + " alice")
		srv = startHTTP("--auth", "token", "--token-file", tokens)
		DeferCleanup(func() { srv.stop() })
	})

	connect := func(ctx context.Context, revision string, opts *mcp.ClientOptions) (*mcp.ClientSession, *wireLog) {
		GinkgoHelper()
		wire := &wireLog{base: mcpclient.Bearer{Token: tokenA, Base: http.DefaultTransport}}
		client := mcp.NewClient(&mcp.Implementation{Name: "e2e-revisions", Version: "1"}, opts)
		sess, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.url, HTTPClient: &http.Client{Transport: wire}, MaxRetries: -1},
			&mcp.ClientSessionOptions{ProtocolVersion: revision})
		Expect(err).NotTo(HaveOccurred(), "server log:\n%s", srv.stderr.String())
		Expect(sess.InitializeResult().ProtocolVersion).To(Equal(revision))
		return sess, wire
	}

	// work is what an agent does: a sandbox, a command, a file, the logs.
	work := func(ctx context.Context, sess *mcp.ClientSession) {
		GinkgoHelper()
		id := initSandbox(ctx, sess, nil)
		res := call(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"echo hi"}})
		Expect(res.IsError).To(BeFalse(), text(res))
		Expect(structured(res)["results"].([]any)[0]).To(HaveKeyWithValue("stdout", "hi\n"))
		Expect(call(ctx, sess, "write_file", map[string]any{"container_id": id, "file_name": "a.txt", "file_contents": "x"}).IsError).To(BeFalse())
		Expect(text(call(ctx, sess, "read_file", map[string]any{"container_id": id, "path": "a.txt"}))).To(Equal("x"))
		logs, err := sess.ReadResource(ctx, &mcp.ReadResourceParams{URI: "containers://" + id + "/logs"})
		Expect(err).NotTo(HaveOccurred())
		Expect(logs.Contents[0].Text).To(ContainSubstring("echo hi"))
		Expect(call(ctx, sess, "sandbox_stop", map[string]any{"container_id": id}).IsError).To(BeFalse())
	}

	It("keeps a 2025-11-25 session alive with the client's pings, then serves its calls", func(ctx SpecContext) {
		sess, wire := connect(ctx, "2025-11-25", &mcp.ClientOptions{KeepAlive: keepAlive})
		defer sess.Close()
		Eventually(wire.pings).WithTimeout(10 * keepAlive).Should(HaveLen(4))
		Expect(wire.pings()).To(HaveEach(http.StatusOK))
		work(ctx, sess)
		for _, r := range wire.records() {
			if r.verb == http.MethodPost && r.method != "initialize" {
				Expect(r.sessionSent).NotTo(BeEmpty(), "%+v", r)
			}
		}
	})

	It("serves a 2026-07-28 client statelessly, across keep-alive intervals, and answers its ping as a method it does not have", func(ctx SpecContext) {
		sess, wire := connect(ctx, "2026-07-28", &mcp.ClientOptions{KeepAlive: keepAlive, KeepAliveFailureThreshold: 1})
		defer sess.Close()
		// go-sdk v1.8.0 starts no keep-alive on a 2026-07-28 session (the
		// revision has no ping); should it send one, it must not be
		// refused in a way that closes the session (400 did, with
		// KeepAliveFailureThreshold 1).
		time.Sleep(5 * keepAlive)
		Expect(wire.pings()).NotTo(ContainElement(Not(Equal(http.StatusNotFound))))
		work(ctx, sess)

		// A ping sent by hand gets what the revision prescribes for a
		// method the server does not implement: 404 with -32601, which the
		// SDK's keep-alive takes for "no ping here" and stops on, instead
		// of closing the session.
		err := sess.Ping(ctx, nil)
		var werr *jsonrpc.Error
		Expect(errors.As(err, &werr)).To(BeTrue(), "ping: %v", err)
		Expect(werr.Code).To(Equal(int64(jsonrpc.CodeMethodNotFound)), "ping: %v", err)
		Expect(wire.pings()).To(HaveEach(http.StatusNotFound))
		Expect(wire.pings()).NotTo(BeEmpty())
		// The session survives it.
		res := call(ctx, sess, "list_sandboxes", nil)
		Expect(res.IsError).To(BeFalse(), text(res))

		// Every request was stateless and carried the 2026-07-28 headers.
		for _, r := range wire.records() {
			Expect(r.verb).To(Equal(http.MethodPost), "2026-07-28 has no GET stream and no DELETE: %+v", r)
			Expect(r.version).To(Equal("2026-07-28"), "%+v", r)
			Expect(r.mcpMethod).To(Equal(r.method), "%+v", r)
			Expect(r.sessionSent).To(BeEmpty(), "%+v", r)
			Expect(r.sessionGot).To(BeEmpty(), "%+v", r)
			if r.method == "tools/call" || r.method == "resources/read" {
				Expect(r.mcpName).NotTo(BeEmpty(), "%+v", r)
			}
		}
	})

	It("serves both revisions to one identity at once, each a sandbox of the other's", func(ctx SpecContext) {
		legacy, _ := connect(ctx, "2025-11-25", nil)
		defer legacy.Close()
		modern, _ := connect(ctx, "2026-07-28", nil)
		defer modern.Close()
		id := initSandbox(ctx, modern, nil)
		res := call(ctx, legacy, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"echo both"}})
		Expect(res.IsError).To(BeFalse(), text(res))
		Expect(text(call(ctx, legacy, "list_sandboxes", nil))).To(ContainSubstring(id))
		Expect(call(ctx, modern, "sandbox_stop", map[string]any{"container_id": id}).IsError).To(BeFalse())
	})
})
