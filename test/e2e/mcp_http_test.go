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
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

const (
	tokenA = "token-aaaaaaaaaaaaaaaaaaaaaaaa"
	tokenB = "token-bbbbbbbbbbbbbbbbbbbbbbbb"
)

var _ = Describe("code-sandbox-mcp over streamable HTTP", Ordered, func() {
	var srv *mcpServer

	BeforeAll(func() {
		tokens := writeTokenFile("# test tokens", tokenA+" alice", tokenB+" bob")
		srv = startHTTP("--auth", "token", "--token-file", tokens, "--max-sandboxes", "25", "--max-body-bytes", "1MiB",
			// One identity holds 20 sessions at once below (default cap: 8 calls).
			"--max-tool-calls-per-identity", "25")
		DeferCleanup(func() { srv.stop() })
	})

	rawPost := func(ctx context.Context, target, token string, hdr map[string]string, body []byte) *http.Response {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
		Expect(err).NotTo(HaveOccurred())
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		for k, v := range hdr {
			if k == "Host" {
				req.Host = v
				continue
			}
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(resp.Body.Close)
		return resp
	}
	initBody := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)

	It("serves health, readiness and the protected resource metadata without a token", func(ctx SpecContext) {
		base := strings.TrimSuffix(srv.url, "/mcp")
		for _, p := range []string{"/healthz", "/readyz"} {
			resp, err := http.Get(base + p)
			Expect(err).NotTo(HaveOccurred())
			resp.Body.Close()
			Expect(resp.StatusCode).To(Equal(http.StatusOK), p)
		}
		resp, err := http.Get(base + "/.well-known/oauth-protected-resource/mcp")
		Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		Expect(resp.StatusCode).To(Equal(http.StatusOK))
		var meta map[string]any
		Expect(json.NewDecoder(resp.Body).Decode(&meta)).To(Succeed())
		Expect(meta).To(HaveKeyWithValue("resource", srv.url))
	})

	It("answers a missing or wrong token with 401 and resource_metadata", func(ctx SpecContext) {
		for _, tok := range []string{"", "wrong-token-wrong-token"} {
			resp := rawPost(ctx, srv.url, tok, nil, initBody)
			Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized), "token %q", tok)
			Expect(resp.Header.Get("WWW-Authenticate")).To(ContainSubstring(`resource_metadata="` + strings.TrimSuffix(srv.url, "/mcp") + `/.well-known/oauth-protected-resource/mcp"`))
		}
		_, err := connectHTTP(ctx, srv.url, "wrong-token-wrong-token", nil, nil)
		Expect(err).To(HaveOccurred())
	})

	It("rejects tokens in the query string", func(ctx SpecContext) {
		resp := rawPost(ctx, srv.url+"?access_token="+url.QueryEscape(tokenA), "", nil, initBody)
		Expect(resp.StatusCode).To(Equal(http.StatusBadRequest))
	})

	It("refuses a foreign Origin, accepts none", func(ctx SpecContext) {
		resp := rawPost(ctx, srv.url, tokenA, map[string]string{"Origin": "https://evil.example"}, initBody)
		Expect(resp.StatusCode).To(Equal(http.StatusForbidden))
		resp = rawPost(ctx, srv.url, tokenA, nil, initBody)
		Expect(resp.StatusCode).To(Equal(http.StatusOK))
	})

	It("refuses a rebinding Host", func(ctx SpecContext) {
		u, _ := url.Parse(srv.url)
		resp := rawPost(ctx, srv.url, tokenA, map[string]string{"Host": "evil.example:" + u.Port()}, initBody)
		Expect(resp.StatusCode).To(Equal(http.StatusForbidden))
	})

	It("refuses an oversized body with 413", func(ctx SpecContext) {
		big := []byte(`{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"` + strings.Repeat("x", 2<<20) + `"}}`)
		resp := rawPost(ctx, srv.url, tokenA, nil, big)
		Expect(resp.StatusCode).To(Equal(http.StatusRequestEntityTooLarge))
	})

	It("binds sessions to the identity that created them", func(ctx SpecContext) {
		resp := rawPost(ctx, srv.url, tokenA, nil, initBody)
		Expect(resp.StatusCode).To(Equal(http.StatusOK))
		sid := resp.Header.Get("Mcp-Session-Id")
		Expect(sid).NotTo(BeEmpty())
		list := []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
		hdr := map[string]string{"Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-11-25"}
		Expect(rawPost(ctx, srv.url, tokenB, hdr, list).StatusCode).To(Equal(http.StatusNotFound))
		Expect(rawPost(ctx, srv.url, tokenA, hdr, list).StatusCode).To(Equal(http.StatusOK))
		hdr["Mcp-Session-Id"] = "0123456789abcdef0123456789abcdef"
		Expect(rawPost(ctx, srv.url, tokenA, hdr, list).StatusCode).To(Equal(http.StatusNotFound))
	})

	It("answers a request flood from one identity with 429", func(ctx SpecContext) {
		tokens := writeTokenFile(tokenA+" alice", tokenB+" bob")
		limited := startHTTP("--auth", "token", "--token-file", tokens, "--rate-limit", "2")
		DeferCleanup(func() { limited.stop() })
		codes := map[int]int{}
		for range 20 {
			resp := rawPost(ctx, limited.url, tokenA, nil, initBody)
			codes[resp.StatusCode]++
			if resp.StatusCode == http.StatusTooManyRequests {
				Expect(resp.Header.Get("Retry-After")).NotTo(BeEmpty())
			}
		}
		Expect(codes[http.StatusTooManyRequests]).To(BeNumerically(">=", 10), "status codes: %v", codes)
		Expect(rawPost(ctx, limited.url, tokenB, nil, initBody).StatusCode).To(Equal(http.StatusOK), "bob is not limited by alice's flood")
	})

	It("refuses an unsupported MCP-Protocol-Version with 400", func(ctx SpecContext) {
		resp := rawPost(ctx, srv.url, tokenA, nil, initBody)
		Expect(resp.StatusCode).To(Equal(http.StatusOK))
		sid := resp.Header.Get("Mcp-Session-Id")
		list := []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
		hdr := map[string]string{"Mcp-Session-Id": sid, "MCP-Protocol-Version": "1999-01-01"}
		Expect(rawPost(ctx, srv.url, tokenA, hdr, list).StatusCode).To(Equal(http.StatusBadRequest))
	})

	It("keeps one identity's sandboxes invisible to another", func(ctx SpecContext) {
		alice, err := connectHTTP(ctx, srv.url, tokenA, nil, nil)
		Expect(err).NotTo(HaveOccurred())
		defer alice.Close()
		bob, err := connectHTTP(ctx, srv.url, tokenB, nil, nil)
		Expect(err).NotTo(HaveOccurred())
		defer bob.Close()

		id := initSandbox(ctx, alice, nil)
		Expect(text(call(ctx, bob, "list_sandboxes", nil))).NotTo(ContainSubstring(id))
		for tool, args := range map[string]map[string]any{
			"sandbox_exec": {"container_id": id, "commands": []string{"echo pwned"}},
			"read_file":    {"container_id": id, "path": "x"},
			"write_file":   {"container_id": id, "file_name": "x", "file_contents": "pwned"},
			"sandbox_stop": {"container_id": id},
		} {
			res := call(ctx, bob, tool, args)
			Expect(res.IsError).To(BeTrue(), tool)
			Expect(text(res)).To(ContainSubstring("not found"), tool)
		}
		_, err = bob.ReadResource(ctx, &mcp.ReadResourceParams{URI: "containers://" + id + "/logs"})
		Expect(err).To(HaveOccurred())
		Expect(text(call(ctx, alice, "list_sandboxes", nil))).To(ContainSubstring(id))
		res := call(ctx, alice, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"ls /app"}})
		Expect(res.IsError).To(BeFalse(), text(res))
		Expect(structured(res)["results"].([]any)[0]).To(HaveKeyWithValue("stdout", ""), "bob wrote nothing")
		Expect(call(ctx, alice, "sandbox_stop", map[string]any{"container_id": id}).IsError).To(BeFalse())
	})

	It("serves 20 concurrent sessions", func(ctx SpecContext) {
		var wg sync.WaitGroup
		errs := make(chan string, 20)
		for i := range 20 {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				s, err := connectHTTP(ctx, srv.url, tokenA, nil, nil)
				if err != nil {
					errs <- err.Error()
					return
				}
				defer s.Close()
				id := initSandbox(ctx, s, nil)
				res := call(ctx, s, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"echo session-" + string(rune('a'+i))}})
				if res.IsError || !strings.Contains(text(res), "session-"+string(rune('a'+i))) {
					errs <- text(res)
				}
				if res := call(ctx, s, "sandbox_stop", map[string]any{"container_id": id}); res.IsError {
					errs <- text(res)
				}
			}()
		}
		wg.Wait()
		close(errs)
		Expect(errs).To(BeEmpty())
		Expect(containersOf(ctx, srv.instance())).To(BeEmpty())
	}, SpecTimeout(3*time.Minute))

	It("refuses unsafe bind and auth combinations at startup", func(ctx SpecContext) {
		for _, args := range [][]string{
			{"--http", "0.0.0.0:0", "--auth", "none"},
			{"--http", "0.0.0.0:0", "--auth", "none", "--allow-remote"},
			{"--http", "127.0.0.1:0"},
			{"--backend", "kubernetes"},
		} {
			cmd := exec.CommandContext(ctx, mcpBinary, args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var exitErr *exec.ExitError
			Expect(err).To(BeAssignableToTypeOf(exitErr), "%v: %s", args, stderr.String())
			Expect(err.(*exec.ExitError).ExitCode()).To(Equal(2), "%v: %s", args, stderr.String())
		}
	})
})
