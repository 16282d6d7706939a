//go:build e2e || mcp_e2e

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// Preview helpers shared by the Docker backend's preview specs
// (mcp_preview_test.go) and the kubernetes backend's (mcp_kube_test.go).

// wsEchoServer is a WebSocket echo server (and, for plain GETs, a mirror
// of the request headers) in Python's standard library only, to run in a
// sandbox: `python3 /tmp/ws.py PORT`.
const wsEchoServer = `import base64, hashlib, http.server, struct, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            acc = base64.b64encode(hashlib.sha1((self.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
            self.send_response(101); self.send_header("Upgrade", "websocket"); self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", acc); self.end_headers(); self.wfile.flush()
            while True:
                h = self.rfile.read(2)
                if len(h) < 2: return
                op, n = h[0] & 15, h[1] & 127
                if n == 126: n = struct.unpack(">H", self.rfile.read(2))[0]
                mask = self.rfile.read(4) if h[1] & 128 else b"\0\0\0\0"
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
                if op == 8: return
                out = b"echo:" + data
                self.wfile.write(bytes([0x81, len(out)]) + out); self.wfile.flush()
        body = "".join("%s: %s\n" % kv for kv in self.headers.items()).encode()
        self.send_response(200); self.send_header("Content-Type", "text/plain"); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
`

// previewGet GETs u with extra headers and returns the status and body.
func previewGet(ctx context.Context, u string, header map[string]string) (int, string) {
	GinkgoHelper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	Expect(err).NotTo(HaveOccurred())
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(body)
}

// wsEcho opens a WebSocket at u (http://…), sends msg and returns the
// answer, speaking RFC 6455 by hand (client frames masked).
func wsEcho(u, msg string) (string, error) {
	pu, err := url.Parse(u)
	if err != nil {
		return "", err
	}
	conn, err := net.DialTimeout("tcp", pu.Host, 10*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", pu.RequestURI(), pu.Host)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-WebSocket-Accept") != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		body, _ := io.ReadAll(resp.Body)
		return "", fmt.Errorf("no upgrade: %s %v %s", resp.Status, resp.Header, body)
	}
	mask := []byte{1, 2, 3, 4}
	frame := append([]byte{0x81, 0x80 | byte(len(msg))}, mask...)
	for i := range len(msg) {
		frame = append(frame, msg[i]^mask[i%4])
	}
	if _, err := conn.Write(frame); err != nil {
		return "", err
	}
	h := make([]byte, 2)
	if _, err := io.ReadFull(br, h); err != nil {
		return "", err
	}
	payload := make([]byte, h[1]&127)
	if _, err := io.ReadFull(br, payload); err != nil {
		return "", err
	}
	return string(payload), nil
}
