//go:build cluster

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package cluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/mcpclient"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// The MCP server pod, reached from the node through its Service: the test
// resolves the Service's name with the cluster's DNS (CoreDNS, through the
// kube-dns Service) and connects to the ClusterIP it gets (kube-proxy's
// rules on the node take it to the pod). That is the URL config/mcp gives
// the server as its --public-url, with the Host header its
// --allowed-hosts accept, so nothing about the Deployment is changed for the
// test. Callers authenticate with a ServiceAccount token of the server's
// audience (code-sandbox-mcp).
func mcpSpecs() {
	Describe("the MCP server pod behind its Service", Ordered, func() {
		const (
			// config/mcp/deployment.yaml's --namespace; deploy does not create it.
			mcpNS     = "sandboxes"
			mcpURL    = "http://" + prefix + "mcp-server." + operatorNS + ".svc:8080/mcp"
			quotaName = "agents"
		)
		var (
			token string
			sess  *mcp.ClientSession
		)

		BeforeAll(func(ctx SpecContext) {
			_, _ = kubectl(ctx, "delete", "namespace", mcpNS, "--ignore-not-found", "--wait", "--timeout=120s")
			mustKubectl(ctx, "create", "namespace", mcpNS)
			DeferCleanup(func(ctx SpecContext) {
				_, _ = kubectl(ctx, "delete", "sandboxes", "--all", "-n", mcpNS, "--wait", "--timeout=90s")
				_, _ = kubectl(ctx, "delete", "namespace", mcpNS, "--ignore-not-found", "--wait=false")
			}, NodeTimeout(3*time.Minute))
			mustKubectl(ctx, "create", "serviceaccount", "agent", "-n", mcpNS)
			mustKubectl(ctx, "create", "rolebinding", "agent-editor", "-n", mcpNS,
				"--clusterrole="+prefix+"sandbox-editor-role", "--serviceaccount="+mcpNS+":agent")
			token = mustKubectl(ctx, "create", "token", "agent", "-n", mcpNS, "--duration=1h", "--audience", "code-sandbox-mcp")

			sess = connectMCP(ctx, token)
		}, NodeTimeout(3*time.Minute))

		It("serves sandbox_initialize, sandbox_exec, file copies and sandbox_stop", func(ctx SpecContext) {
			id := mcpInit(ctx, sess)
			Expect(mustKubectl(ctx, "get", "sandboxes", "-n", mcpNS, "-o", "jsonpath={.items[*].status.nodeName}")).To(BeElementOf(workers))

			res := mcpCall(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"python3 -c 'print(6*7)'", "id -u"}})
			Expect(res.IsError).To(BeFalse(), mcpText(res))
			Expect(mcpText(res)).To(ContainSubstring("42"))

			res = mcpCall(ctx, sess, "write_file", map[string]any{"container_id": id, "file_name": "main.py", "file_contents": "print('from a file')\n", "dest_dir": "/app/src"})
			Expect(res.IsError).To(BeFalse(), mcpText(res))
			res = mcpCall(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"python3 /app/src/main.py"}})
			Expect(res.IsError).To(BeFalse(), mcpText(res))
			Expect(mcpText(res)).To(ContainSubstring("from a file"))

			// copy_file reads a file on the MCP server's own host: the pod has
			// none to offer (no --allow-host-dir), and says so.
			res = mcpCall(ctx, sess, "copy_file", map[string]any{"container_id": id, "local_src_file": "/etc/hostname", "dest_path": "/tmp/x"})
			GinkgoWriter.Printf("copy_file without a host directory: error=%v %s\n", res.IsError, mcpText(res))
			Expect(res.IsError).To(BeTrue(), "the MCP pod must not hand out its own files")

			res = mcpCall(ctx, sess, "sandbox_stop", map[string]any{"container_id": id})
			Expect(res.IsError).To(BeFalse(), mcpText(res))
			Eventually(func() (string, error) {
				out, err := kubectl(ctx, "get", "sandboxes", "-n", mcpNS, "-o", "name")
				return strings.TrimSpace(out), err
			}).WithContext(ctx).WithTimeout(60 * time.Second).Should(BeEmpty())
		}, NodeTimeout(4*time.Minute))

		It("refuses tokens of another audience", func(ctx SpecContext) {
			other := mustKubectl(ctx, "create", "token", "agent", "-n", mcpNS, "--duration=10m")
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, mcpURL, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
			Expect(err).NotTo(HaveOccurred())
			req.Header.Set("Authorization", "Bearer "+other)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err := serviceHTTPClient(ctx).Do(req)
			Expect(err).NotTo(HaveOccurred())
			resp.Body.Close()
			Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized))
		}, NodeTimeout(time.Minute))

		It("passes a SandboxQuota refusal from the webhook Service to the MCP client word for word", func(ctx SpecContext) {
			Expect(kubectlApply(ctx, fmt.Sprintf(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: SandboxQuota
metadata:
  name: %s
  namespace: %s
spec:
  hard:
    sandboxes: 1
  # Above the MCP server's --max-lifetime (4h by default), which is the
  # lifetime it asks for.
  maxActiveDeadlineSeconds: 86400
  allowedImages:
  - code-sandbox-test/*
`, quotaName, mcpNS))).To(Succeed())
			Eventually(func() (string, error) {
				return kubectl(ctx, "get", "sandboxquota", quotaName, "-n", mcpNS, "-o", "jsonpath={.metadata.generation}/{.status.observedGeneration}")
			}).WithContext(ctx).WithTimeout(time.Minute).Should(Equal("1/1"))

			first := mcpInit(ctx, sess)
			res := mcpCall(ctx, sess, "sandbox_initialize", map[string]any{"image": sampleImage})
			Expect(res.IsError).To(BeTrue(), mcpText(res))
			Expect(mcpText(res)).To(ContainSubstring(`admission webhook "sandbox-quota.code-sandbox.dev" denied the request: ` +
				`sandbox quota "` + quotaName + `" exceeded: sandboxes: requested 1, used 1, limit 1 (1 over)`))

			res = mcpCall(ctx, sess, "sandbox_initialize", map[string]any{"image": "evil/x:1"})
			Expect(res.IsError).To(BeTrue(), mcpText(res))
			Expect(mcpText(res)).To(ContainSubstring(`sandbox quota "` + quotaName + `" does not allow image "evil/x:1"`))

			res = mcpCall(ctx, sess, "sandbox_stop", map[string]any{"container_id": first})
			Expect(res.IsError).To(BeFalse(), mcpText(res))
			mustKubectl(ctx, "delete", "sandboxquota", quotaName, "-n", mcpNS)
		}, NodeTimeout(4*time.Minute))

		It("keeps the sandboxes when every MCP pod is deleted, and serves them from the pods the Deployment recreates", func(ctx SpecContext) {
			id := mcpInit(ctx, sess)
			pods := strings.Fields(mustKubectl(ctx, "get", "pods", "-n", operatorNS, "-l", "app.kubernetes.io/component=mcp-server", "-o", "jsonpath={.items[*].metadata.name}"))
			Expect(pods).NotTo(BeEmpty())
			// A graceful delete of every replica: each drains and leaves
			// the Sandboxes it created alone on SIGTERM.
			mustKubectl(ctx, append([]string{"delete", "pod", "-n", operatorNS, "--wait", "--timeout=120s"}, pods...)...)
			_, err := kubectl(ctx, "rollout", "status", "-n", operatorNS, "deployment/"+prefix+"mcp-server", "--timeout=180s")
			Expect(err).NotTo(HaveOccurred(), describeOperator(ctx))
			Expect(mustKubectl(ctx, "get", "sandbox", id, "-n", mcpNS, "-o", "name")).To(Equal("sandbox.sandbox.code-sandbox.dev/"+id), "the Sandbox went with the MCP pods")

			By("using the same sandbox through the new pods")
			sess = connectMCP(ctx, token)
			res := mcpCall(ctx, sess, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"echo still-here"}})
			Expect(res.IsError).To(BeFalse(), mcpText(res))
			Expect(mcpText(res)).To(ContainSubstring("still-here"))
			res = mcpCall(ctx, sess, "sandbox_stop", map[string]any{"container_id": id})
			Expect(res.IsError).To(BeFalse(), mcpText(res))
		}, NodeTimeout(5*time.Minute))
	})
}

// clusterDNS is the kube-dns Service's ClusterIP.
func clusterDNS(ctx context.Context) string {
	GinkgoHelper()
	return mustKubectl(ctx, "get", "service", "kube-dns", "-n", "kube-system", "-o", "jsonpath={.spec.clusterIP}")
}

// serviceHTTPClient resolves Service names (NAME.NAMESPACE.svc) with the
// cluster's DNS, as a pod would, and connects to the ClusterIP.
func serviceHTTPClient(ctx context.Context) *http.Client {
	GinkgoHelper()
	dnsAddr := net.JoinHostPort(clusterDNS(ctx), "53")
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, dnsAddr)
	}}
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		if strings.HasSuffix(host, ".svc") {
			ips, err := resolver.LookupHost(ctx, host+".cluster.local.")
			if err != nil {
				return nil, fmt.Errorf("resolving %s with the cluster DNS %s: %w", host, dnsAddr, err)
			}
			host = ips[0]
		}
		return dialer.DialContext(ctx, network, net.JoinHostPort(host, port))
	}
	return &http.Client{Transport: tr}
}

func connectMCP(ctx context.Context, token string) *mcp.ClientSession {
	GinkgoHelper()
	client := mcp.NewClient(&mcp.Implementation{Name: "cluster-e2e", Version: "1"}, nil)
	base := serviceHTTPClient(ctx)
	hc := &http.Client{Transport: mcpclient.Bearer{Token: token, Base: base.Transport}}
	var sess *mcp.ClientSession
	// The Service may still be settling on a new pod.
	Eventually(func() error {
		var err error
		sess, err = client.Connect(ctx, &mcp.StreamableClientTransport{
			Endpoint: "http://" + prefix + "mcp-server." + operatorNS + ".svc:8080/mcp", HTTPClient: hc, MaxRetries: -1,
		}, nil)
		return err
	}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(Succeed())
	DeferCleanup(func() { _ = sess.Close() })
	return sess
}

// The MCP client helpers the suites share (internal/testenv/mcpclient).
var (
	mcpCall = mcpclient.Call
	mcpText = mcpclient.Text
)

func mcpInit(ctx context.Context, s *mcp.ClientSession) string {
	GinkgoHelper()
	return mcpclient.Initialize(ctx, s, map[string]any{"image": sampleImage})
}
