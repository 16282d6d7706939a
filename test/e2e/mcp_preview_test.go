//go:build mcp_e2e && linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// expose calls expose_port and returns the preview URL.
func expose(ctx context.Context, s *mcp.ClientSession, id string, port int, extra map[string]any) string {
	GinkgoHelper()
	args := map[string]any{"container_id": id, "port": port}
	for k, v := range extra {
		args[k] = v
	}
	res := call(ctx, s, "expose_port", args)
	Expect(res.IsError).To(BeFalse(), text(res))
	u, _ := structured(res)["url"].(string)
	Expect(u).To(MatchRegexp(`^http://127\.0\.0\.1:\d+/preview/v1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+/$`))
	return u
}

func execOK(ctx context.Context, s *mcp.ClientSession, id, command string) string {
	GinkgoHelper()
	res := call(ctx, s, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{command}})
	Expect(res.IsError).To(BeFalse(), text(res))
	Expect(text(res)).NotTo(ContainSubstring("exit code: 1"), text(res))
	return text(res)
}

// startServers starts python3 -m http.server on 8000 (a page) and the
// WebSocket echo server on 8001 in the sandbox, in the background.
func startServers(ctx context.Context, s *mcp.ClientSession, id, page string) {
	GinkgoHelper()
	res := call(ctx, s, "write_file", map[string]any{"container_id": id, "file_name": "index.html", "file_contents": page, "dest_dir": "/tmp/site"})
	Expect(res.IsError).To(BeFalse(), text(res))
	res = call(ctx, s, "write_file", map[string]any{"container_id": id, "file_name": "ws.py", "file_contents": wsEchoServer, "dest_dir": "/tmp"})
	Expect(res.IsError).To(BeFalse(), text(res))
	execOK(ctx, s, id, `cd /tmp/site && (nohup python3 -m http.server 8000 --bind 127.0.0.1 >/tmp/http.log 2>&1 &) && (nohup python3 /tmp/ws.py 8001 >/tmp/ws.log 2>&1 &) && python3 -c '
import socket, time
for p in (8000, 8001):
    for i in range(100):
        try: socket.create_connection(("127.0.0.1", p)).close(); break
        except OSError: time.sleep(0.1)
    else: raise SystemExit("port %d never listened" % p)'`)
}

var previewPrefixRE = regexp.MustCompile(`/preview/(v1\.[^./]+)\.([^/]+)/`)

var _ = Describe("preview URLs (expose_port)", Ordered, func() {
	var (
		ctx    context.Context
		srv    *mcpServer
		s      *mcp.ClientSession
		a, b   string
		pageA  = "<html><head><title>sandbox A</title></head><body><h1 id=\"greeting\">hello from python in sandbox A</h1></body></html>\n"
		pageB  = "<html><body><h1>this is sandbox B</h1></body></html>\n"
		urlA   string
		cancel context.CancelFunc
	)

	BeforeAll(func() {
		ctx, cancel = context.WithTimeout(context.Background(), 5*time.Minute)
		DeferCleanup(func() { cancel() })
		srv = startHTTP("--auth", "none", "--preview-addr", "127.0.0.1:0")
		DeferCleanup(srv.stop)
		var err error
		s, err = connectHTTP(ctx, srv.url, "", nil, nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		a = initSandbox(ctx, s, nil)
		b = initSandbox(ctx, s, nil)
		for _, id := range []string{a, b} {
			res := call(ctx, s, "list_sandboxes", map[string]any{})
			Expect(text(res)).To(ContainSubstring(id))
		}
		startServers(ctx, s, a, pageA)
		startServers(ctx, s, b, pageB)
		urlA = expose(ctx, s, a, 8000, nil)
	})

	It("serves a page from a sandbox with no network, over HTTP", func() {
		res := call(ctx, s, "list_sandboxes", map[string]any{})
		sandboxes, _ := structured(res)["sandboxes"].([]any)
		Expect(sandboxes).NotTo(BeEmpty())
		for _, sb := range sandboxes {
			Expect(sb).To(HaveKeyWithValue("network", "none"), "the sandboxes have no network")
		}
		code, body := previewGet(ctx, urlA, nil)
		Expect(code).To(Equal(http.StatusOK), body)
		Expect(body).To(Equal(pageA))
		code, body = previewGet(ctx, urlA+"missing.html", nil)
		Expect(code).To(Equal(http.StatusNotFound), body)

		// What a request costs: one helper exec to dial, then the proxy.
		var took []time.Duration
		for range 15 {
			start := time.Now()
			code, _ := previewGet(ctx, urlA, nil)
			took = append(took, time.Since(start))
			Expect(code).To(Equal(http.StatusOK))
		}
		slices.Sort(took)
		AddReportEntry("preview GET round trip", fmt.Sprintf("p50 %s, max %s over %d requests", took[len(took)/2], took[len(took)-1], len(took)))
	})

	It("loads the page in headless Chromium", func() {
		chromium, err := exec.LookPath("chromium")
		if err != nil {
			if os.Getenv("CODE_SANDBOX_REQUIRE_BROWSER") != "" {
				Fail("chromium is not installed (apt-get install -y chromium)")
			}
			Skip("chromium is not installed (apt-get install -y chromium); CODE_SANDBOX_REQUIRE_BROWSER=1 makes this a failure")
		}
		bctx, bcancel := context.WithTimeout(ctx, 90*time.Second)
		defer bcancel()
		start := time.Now()
		out, err := exec.CommandContext(bctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
			"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
			"--user-data-dir="+GinkgoT().TempDir(), "--dump-dom", urlA).Output()
		Expect(err).NotTo(HaveOccurred(), "chromium: %s", out)
		GinkgoWriter.Printf("chromium --dump-dom took %s\n", time.Since(start))
		Expect(string(out)).To(ContainSubstring(`<h1 id="greeting">hello from python in sandbox A</h1>`))
		Expect(string(out)).To(ContainSubstring(`<title>sandbox A</title>`))
	})

	It("proxies a WebSocket, and strips the MCP endpoint's credentials", func() {
		u := expose(ctx, s, a, 8001, nil)
		answer, err := wsEcho(u+"ws", "ping over the preview")
		Expect(err).NotTo(HaveOccurred())
		Expect(answer).To(Equal("echo:ping over the preview"))

		code, body := previewGet(ctx, u+"headers", map[string]string{
			"Authorization": "Bearer secret-mcp-token", "Mcp-Session-Id": "secret-session", "X-App": "kept",
		})
		Expect(code).To(Equal(http.StatusOK), body)
		Expect(body).NotTo(ContainSubstring("secret"))
		Expect(body).To(ContainSubstring("X-App: kept"))
		Expect(body).To(ContainSubstring("Host: 127.0.0.1:8001"))
	})

	It("refuses a tampered token, and one signed for another sandbox's port", func() {
		m := previewPrefixRE.FindStringSubmatch(urlA)
		Expect(m).NotTo(BeNil())
		// Flip the signature's first character.
		sig := []byte(m[2])
		sig[0] = map[bool]byte{true: 'B', false: 'A'}[sig[0] == 'A']
		code, body := previewGet(ctx, strings.Replace(urlA, m[2], string(sig), 1), nil)
		Expect(code).To(Equal(http.StatusForbidden), body)
		Expect(body).To(ContainSubstring("invalid"))
		// A's signature on a payload naming B (same port): refused, never B's page.
		bURL := expose(ctx, s, b, 8000, nil)
		mb := previewPrefixRE.FindStringSubmatch(bURL)
		payloadB := strings.TrimPrefix(mb[1], "v1.")
		forged := strings.Replace(urlA, m[1], "v1."+payloadB, 1)
		code, body = previewGet(ctx, forged, nil)
		Expect(code).To(Equal(http.StatusForbidden), body)
		Expect(body).NotTo(ContainSubstring("sandbox B"))
		// B's own URL reaches B, A's reaches A.
		_, body = previewGet(ctx, bURL, nil)
		Expect(body).To(Equal(pageB))
		_, body = previewGet(ctx, urlA, nil)
		Expect(body).To(Equal(pageA))
		// Garbage and paths outside the prefix.
		for _, p := range []string{"/preview/garbage/", "/preview/v1.a.b/", "/"} {
			code, _ = previewGet(ctx, strings.SplitN(urlA, "/preview/", 2)[0]+p, nil)
			Expect(code).To(BeElementOf(http.StatusForbidden, http.StatusNotFound), p)
		}
	})

	It("refuses an expired URL", func() {
		u := expose(ctx, s, a, 8000, map[string]any{"expires_in_seconds": 1})
		time.Sleep(2100 * time.Millisecond)
		code, body := previewGet(ctx, u, nil)
		Expect(code).To(Equal(http.StatusForbidden), body)
		Expect(body).To(ContainSubstring("expired"))
		res := call(ctx, s, "expose_port", map[string]any{"container_id": a, "port": 8000, "expires_in_seconds": 999999})
		Expect(res.IsError).To(BeTrue())
		res = call(ctx, s, "expose_port", map[string]any{"container_id": a, "port": 0})
		Expect(res.IsError).To(BeTrue())
	})

	It("revokes with unexpose_port and when the port is exposed again", func() {
		u1 := expose(ctx, s, a, 8000, nil)
		u2 := expose(ctx, s, a, 8000, nil)
		code, _ := previewGet(ctx, u1, nil)
		Expect(code).To(Equal(http.StatusForbidden), "an earlier URL of a re-exposed port must be revoked")
		code, _ = previewGet(ctx, u2, nil)
		Expect(code).To(Equal(http.StatusOK))
		res := call(ctx, s, "unexpose_port", map[string]any{"container_id": a, "port": 8000})
		Expect(res.IsError).To(BeFalse(), text(res))
		Expect(structured(res)["revoked"]).To(BeTrue())
		code, body := previewGet(ctx, u2, nil)
		Expect(code).To(Equal(http.StatusForbidden), body)
		Expect(body).To(ContainSubstring("revoked"))
		urlA = expose(ctx, s, a, 8000, nil)

		// The echo server keeps connections alive, so the proxy reuses
		// one: revocation must still refuse the next request on it.
		u3 := expose(ctx, s, a, 8001, nil)
		for range 3 {
			code, body := previewGet(ctx, u3+"headers", nil)
			Expect(code).To(Equal(http.StatusOK), body)
		}
		res = call(ctx, s, "unexpose_port", map[string]any{"container_id": a, "port": 8001})
		Expect(res.IsError).To(BeFalse(), text(res))
		code, body = previewGet(ctx, u3+"headers", nil)
		Expect(code).To(Equal(http.StatusForbidden), body)
	})

	It("says when nothing listens on the port", func() {
		u := expose(ctx, s, a, 9, nil)
		code, body := previewGet(ctx, u, nil)
		Expect(code).To(Equal(http.StatusBadGateway), body)
		Expect(body).To(ContainSubstring("port 9"))
	})

	It("ends every preview of a sandbox with the sandbox", func() {
		res := call(ctx, s, "sandbox_stop", map[string]any{"container_id": a})
		Expect(res.IsError).To(BeFalse(), text(res))
		code, body := previewGet(ctx, urlA, nil)
		Expect(code).To(Equal(http.StatusNotFound), body)
	})
})
