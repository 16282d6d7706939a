/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi_test

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

// portForward opens the portforward upgrade as the aggregated API server
// does, and returns the upgraded connection (with what was read past the
// 101), or the refusal.
func portForward(ts *testServer, ns, name, query string, upgrade bool) (*tls.Conn, *bufio.Reader, *http.Response) {
	GinkgoHelper()
	u, err := url.Parse(ts.Endpoint)
	Expect(err).NotTo(HaveOccurred())
	conn, err := tls.Dial("tcp", u.Host, nodeTLSConfig(ts.node, aggregatorCert))
	Expect(err).NotTo(HaveOccurred())
	req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("%s%s%s/sandboxes/%s/%s?%s", ts.Endpoint, subresource.PathPrefix, ns, name, subresource.SubresourcePortForward, query), nil)
	Expect(err).NotTo(HaveOccurred())
	if upgrade {
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", subresource.PortForwardProtocol)
	}
	runner.setHeaders(req.Header)
	Expect(req.Write(conn)).To(Succeed())
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	Expect(err).NotTo(HaveOccurred())
	if resp.StatusCode != http.StatusSwitchingProtocols {
		conn.Close()
		return nil, nil, resp
	}
	return conn, br, resp
}

var _ = Describe("portforward", Ordered, func() {
	var ns, name string

	BeforeAll(func() {
		ns = newNamespace()
		sbx := createSandbox(ns, uniqueName("pf"))
		name = sbx.Name
		waitReady(sbx)
		// The Sandbox has no network (the default): the port is reached
		// through the helper in its network namespace.
		res := api.exec(ns, name, execio.Request{Shell: `mkdir -p /tmp/www && echo forwarded > /tmp/www/index.html && httpd -p 127.0.0.1:8080 -h /tmp/www && for i in $(seq 50); do wget -q -O /dev/null http://127.0.0.1:8080/ && exit 0; sleep 0.1; done; exit 1`})
		Expect(res.status).To(Equal(http.StatusOK))
		Expect(res.result).NotTo(BeNil(), "error frame: %s", res.errorFrame)
		Expect(res.result.ExitCode).To(BeZero(), "stderr: %s", res.stderr.String())
	})

	It("carries a TCP connection to a port in the sandbox both ways", func() {
		conn, br, resp := portForward(api, ns, name, "port=8080", true)
		Expect(resp.StatusCode).To(Equal(http.StatusSwitchingProtocols))
		Expect(resp.Header.Get("Upgrade")).To(Equal(subresource.PortForwardProtocol))
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		_, err := io.WriteString(conn, "GET /index.html HTTP/1.0\r\n\r\n")
		Expect(err).NotTo(HaveOccurred())
		Expect(conn.CloseWrite()).To(Succeed())
		got, err := io.ReadAll(br)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(got)).To(HavePrefix("HTTP/1.1 200 OK"))
		Expect(string(got)).To(HaveSuffix("\r\n\r\nforwarded\n"))
	})

	It("refuses a closed port with a Status naming it", func() {
		_, _, resp := portForward(api, ns, name, "port=9", true)
		Expect(resp.StatusCode).To(Equal(http.StatusBadGateway))
		st := statusOf(resp)
		Expect(st.Message).To(ContainSubstring("port 9"))
		Expect(st.Details.Causes).To(ContainElement(HaveField("Type", subresource.CausePortClosed)))
	})

	It("refuses a request that is not the upgrade, and ports outside 1-65535", func() {
		for _, c := range []struct {
			query   string
			upgrade bool
		}{{"port=8080", false}, {"port=0", true}, {"port=65536", true}, {"port=http", true}, {"", true}} {
			_, _, resp := portForward(api, ns, name, c.query, c.upgrade)
			Expect(resp.StatusCode).To(Equal(http.StatusBadRequest), "%+v", c)
			st := statusOf(resp)
			Expect(st.Reason).To(Equal(metav1.StatusReasonBadRequest))
			Expect(st.Details.Causes).To(ContainElement(HaveField("Type", subresource.CauseInvalidPortForward)), "%+v", c)
		}
		resp := api.do(request{method: http.MethodGet, namespace: ns, name: name, subresource: subresource.SubresourcePortForward, query: "port=8080"})
		Expect(resp.StatusCode).To(Equal(http.StatusMethodNotAllowed))
		resp.Body.Close()
	})
})
