//go:build e2e

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/code-sandbox/code-sandbox-operator/internal/operatorca"
)

// A node API endpoint that is not a node's: the status of a Sandbox names
// a listener that poses as node forgedNode with a self-signed certificate.
// Only forgedNode's manager may write that status (the status policy), so
// the specs write it with a token of that manager's, as a compromised or
// impersonated manager would. Whoever runs `kubectl sandbox exec` or the MCP
// server's sandbox_exec on the Sandbox must lose nothing to the listener:
// the operator's aggregated API server, which makes the connection, checks
// the node's certificate against the operator CA and the node's name
// before it sends anything, so the listener never completes a handshake,
// sees no request bytes and no client certificate, and never a token.
var _ = Describe("A forged node API endpoint", Ordered, func() {
	const (
		// No manager runs for forgedNode; the specs play its manager.
		forgedNode = "e2e-forged-node"
		namespace  = "forged-e2e"
		managedBy  = "app.kubernetes.io/managed-by=code-sandbox-mcp"
	)
	var (
		forged *forgedListener
		// managerKubeconfig holds a token of the manager ServiceAccount
		// bound to a Pod on forgedNode.
		managerKubeconfig string
		// agentToken is the MCP caller's token (audience code-sandbox-mcp),
		// userKubeconfig a token kubeconfig of the same ServiceAccount
		// (API server audience) for kubectl sandbox.
		agentToken     string
		userKubeconfig string
		userToken      string
		sess           *mcp.ClientSession
		sandboxName    string
	)

	BeforeAll(func(ctx SpecContext) {
		var err error
		forged, err = startForgedListener(forgedNode)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(forged.close)

		managerKubeconfig, err = nodeKubeconfig(ctx, forgedNode)
		Expect(err).NotTo(HaveOccurred())

		_, err = kubectl(ctx, "create", "namespace", namespace)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx SpecContext) {
			// Nothing holds a finalizer (no manager claimed them for
			// real), so the Sandboxes go at once.
			_, _ = kubectl(ctx, "delete", "sandboxes", "--all", "-n", namespace, "--wait=false")
			_, _ = kubectl(ctx, "delete", "namespace", namespace, "--ignore-not-found", "--wait=false")
		}, NodeTimeout(time.Minute))
		_, err = kubectl(ctx, "create", "serviceaccount", "agent", "-n", namespace)
		Expect(err).NotTo(HaveOccurred())
		_, err = kubectl(ctx, "create", "rolebinding", "agent-editor", "-n", namespace,
			"--clusterrole="+editorRole, "--serviceaccount="+namespace+":agent")
		Expect(err).NotTo(HaveOccurred())
		out, err := kubectl(ctx, "create", "token", "agent", "-n", namespace, "--duration=1h", "--audience", "code-sandbox-mcp")
		Expect(err).NotTo(HaveOccurred())
		agentToken = strings.TrimSpace(out)
		out, err = kubectl(ctx, "create", "token", "agent", "-n", namespace, "--duration=1h")
		Expect(err).NotTo(HaveOccurred())
		userToken = strings.TrimSpace(out)
		userKubeconfig, err = tokenKubeconfig("forged-agent", userToken)
		Expect(err).NotTo(HaveOccurred())

		url, _ := startKubeMCPHTTP("--backend", "kubernetes", "--namespace", namespace, "--kubeconfig", kubeconfig,
			"--node-name", forgedNode, "--default-image", sampleImage, "--pull-policy", "Never",
			"--ready-timeout", "90s", "--http", "127.0.0.1:0", "--auth", "kubernetes")
		sess = connectKubeMCP(ctx, url, agentToken, "e2e-forged", nil)
	}, NodeTimeout(3*time.Minute))

	It("lets forgedNode's manager point a Sandbox at the listener, and sandbox_initialize believe it", func(ctx SpecContext) {
		done := make(chan *mcp.CallToolResult, 1)
		go func() {
			defer GinkgoRecover()
			done <- kmcpCall(ctx, sess, "sandbox_initialize", map[string]any{})
		}()
		Eventually(func() (string, error) {
			out, err := kubectl(ctx, "get", "sandboxes", "-n", namespace, "-l", managedBy, "-o", "jsonpath={.items[*].metadata.name}")
			sandboxName = strings.TrimSpace(out)
			return sandboxName, err
		}).WithContext(ctx).WithTimeout(30 * time.Second).ShouldNot(BeEmpty())
		Expect(sandboxName).NotTo(ContainSubstring(" "))

		By("writing the status as the manager of " + forgedNode + " (the policy allows it for its own node)")
		status := fmt.Sprintf(`{"status":{"nodeName":%q,"nodeAPIEndpoint":%q,"containerID":"forged","conditions":[`+
			`{"type":"Ready","status":"True","reason":"Running","message":"forged","lastTransitionTime":%q}]}}`,
			forgedNode, "https://"+forged.addr(), time.Now().UTC().Format(time.RFC3339))
		_, err := run(ctx, repoRoot, "kubectl", "--kubeconfig", managerKubeconfig, "patch", "sandbox", sandboxName, "-n", namespace,
			"--subresource=status", "--type=merge", "-p", status)
		Expect(err).NotTo(HaveOccurred())

		By("checking that nobody else may: the cluster admin is refused by the policy")
		_, err = kubectl(ctx, "patch", "sandbox", sandboxName, "-n", namespace, "--subresource=status", "--type=merge",
			"-p", `{"status":{"nodeAPIEndpoint":"https://127.0.0.1:1"}}`)
		Expect(err).To(MatchError(ContainSubstring("only the node managers (" + managerUser + ") may write the status")))

		var res *mcp.CallToolResult
		Eventually(done).WithContext(ctx).WithTimeout(time.Minute).Should(Receive(&res))
		Expect(res.IsError).To(BeFalse(), kmcpText(res))
		Expect(kmcpStructured(res)).To(HaveKeyWithValue("container_id", sandboxName))
	}, NodeTimeout(2*time.Minute))

	It("gets nothing from the MCP server's sandbox_exec", func(ctx SpecContext) {
		Expect(sandboxName).NotTo(BeEmpty(), "the first spec created no Sandbox")
		before := forged.stats().connections
		res := kmcpCall(ctx, sess, "sandbox_exec", map[string]any{"container_id": sandboxName, "commands": []string{"echo secret-command"}})
		Expect(res.IsError).To(BeTrue(), kmcpText(res))
		Expect(kmcpText(res)).NotTo(ContainSubstring("secret-command\n"))
		GinkgoWriter.Printf("sandbox_exec: %s\n", kmcpText(res))

		res = kmcpCall(ctx, sess, "write_file", map[string]any{"container_id": sandboxName, "file_name": "secret.txt", "file_contents": "secret-file"})
		Expect(res.IsError).To(BeTrue(), kmcpText(res))

		st := forged.stats()
		Expect(st.connections).To(BeNumerically(">", before), "the aggregated API server never tried the endpoint, so this proves nothing")
		forged.expectNothingLeaked(agentToken, userToken, "secret-command", "secret-file")
	}, NodeTimeout(2*time.Minute))

	It("gets nothing from kubectl sandbox exec and cp", func(ctx SpecContext) {
		Expect(sandboxName).NotTo(BeEmpty(), "the first spec created no Sandbox")
		before := forged.stats().connections
		for _, args := range [][]string{
			{"exec", sandboxName, "--", "echo", "secret-command"},
			{"cp", "/etc/hostname", sandboxName + ":/tmp/secret-file"},
		} {
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			cmd := exec.CommandContext(ctx, pluginBin, append([]string{"--kubeconfig", userKubeconfig, "-n", namespace}, args...)...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			cancel()
			var exitErr *exec.ExitError
			Expect(errors.As(err, &exitErr)).To(BeTrue(), "kubectl sandbox %v: %v\n%s", args, err, stderr.String())
			Expect(exitErr.ExitCode()).To(Equal(1), stderr.String())
			Expect(stdout.String()).To(BeEmpty())
			Expect(stderr.String()).To(ContainSubstring(forgedNode), "the error should say which node failed")
			GinkgoWriter.Printf("kubectl sandbox %v: %s", args, stderr.String())
		}
		Expect(forged.stats().connections).To(BeNumerically(">", before), "the aggregated API server never tried the endpoint, so this proves nothing")
		forged.expectNothingLeaked(agentToken, userToken, "secret-command", "secret-file")
	}, NodeTimeout(2*time.Minute))
})

// forgedListener is a TLS server that poses as a node: a self-signed
// certificate with the node's common name, asking for (not requiring) a
// client certificate so that one would be recorded if a client sent it. It
// records everything it receives.
type forgedListener struct {
	l    net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex
	st   forgedStats
	conf *tls.Config
}

type forgedStats struct {
	// connections accepted; handshakes completed; client certificates
	// presented; application bytes read after a handshake.
	connections, handshakes, clientCerts int
	appBytes                             []byte
	// raw is every byte received on the wire, encrypted or not.
	raw []byte
	// handshakeErrors say how the handshakes ended.
	handshakeErrors []string
}

func startForgedListener(node string) (*forgedListener, error) {
	cert, err := operatorca.SelfSigned(operatorca.NodeCommonName(node), []string{"localhost", node, "127.0.0.1"},
		x509.ExtKeyUsageServerAuth, time.Hour)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &forgedListener{l: l, conf: &tls.Config{
		Certificates: []tls.Certificate{*cert},
		ClientAuth:   tls.RequestClientCert,
		NextProtos:   []string{"h2", "http/1.1"},
	}}
	f.wg.Add(1)
	go f.serve()
	return f, nil
}

func (f *forgedListener) addr() string { return f.l.Addr().String() }

func (f *forgedListener) serve() {
	defer f.wg.Done()
	for {
		conn, err := f.l.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.st.connections++
		f.mu.Unlock()
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.handle(conn)
		}()
	}
}

func (f *forgedListener) handle(conn net.Conn) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	tc := tls.Server(&recordingConn{Conn: conn, f: f}, f.conf)
	err := tc.Handshake()
	f.mu.Lock()
	if err != nil {
		f.st.handshakeErrors = append(f.st.handshakeErrors, err.Error())
		f.mu.Unlock()
		return
	}
	f.st.handshakes++
	f.st.clientCerts += len(tc.ConnectionState().PeerCertificates)
	f.mu.Unlock()
	data, _ := io.ReadAll(io.LimitReader(tc, 1<<20))
	f.mu.Lock()
	f.st.appBytes = append(f.st.appBytes, data...)
	f.mu.Unlock()
}

func (f *forgedListener) stats() forgedStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.st
	st.appBytes = bytes.Clone(f.st.appBytes)
	st.raw = bytes.Clone(f.st.raw)
	st.handshakeErrors = append([]string(nil), f.st.handshakeErrors...)
	return st
}

// expectNothingLeaked: no handshake completed, so no request bytes and no
// client certificate arrived, and none of secrets crossed the wire in any
// form the listener could read.
func (f *forgedListener) expectNothingLeaked(secrets ...string) {
	GinkgoHelper()
	st := f.stats()
	GinkgoWriter.Printf("forged listener: %d connections, %d handshakes, handshake errors %q\n", st.connections, st.handshakes, st.handshakeErrors)
	Expect(st.handshakes).To(BeZero(), "a client completed the TLS handshake with the forged node")
	Expect(st.clientCerts).To(BeZero(), "a client presented its certificate to the forged node")
	Expect(st.appBytes).To(BeEmpty(), "the forged node received request bytes")
	for _, s := range append(secrets, "Bearer", "Authorization", "X-Remote-User") {
		Expect(bytes.Contains(st.raw, []byte(s))).To(BeFalse(), "%q crossed the wire to the forged node", s)
	}
}

func (f *forgedListener) close() {
	_ = f.l.Close()
	f.wg.Wait()
}

// recordingConn records what the forged listener reads off the wire.
type recordingConn struct {
	net.Conn
	f *forgedListener
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.f.mu.Lock()
	c.f.st.raw = append(c.f.st.raw, p[:n]...)
	c.f.mu.Unlock()
	return n, err
}
