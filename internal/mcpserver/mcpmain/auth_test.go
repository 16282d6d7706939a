/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package mcpmain

import (
	"context"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/auth"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/mcpclient"
)

const initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"test","version":"1"}}}`

// initialize sends an MCP initialize with token and returns the status
// code, the WWW-Authenticate header and the body.
func initialize(ctx context.Context, url, token string) (int, string, string) {
	GinkgoHelper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(initializeBody))
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate"), string(body)
}

type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

// connect opens an MCP session with token; it is closed when the calling
// node ends.
func connect(ctx context.Context, url, token string) *mcp.ClientSession {
	GinkgoHelper()
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	hc := &http.Client{Transport: bearer{token: token, base: http.DefaultTransport}}
	s, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1}, nil)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(s.Close)
	return s
}

func callTool(ctx context.Context, s *mcp.ClientSession, name string, args map[string]any) (*mcp.CallToolResult, string) {
	GinkgoHelper()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	Expect(err).NotTo(HaveOccurred(), "calling %s", name)
	return res, mcpclient.Text(res)
}

// Tokens for the server's own audience are MCP credentials; tokens for the
// API server's audiences are not, unless --accept-apiserver-audience says so.
var _ = Describe("--auth kubernetes token audiences", Ordered, func() {
	var ns, mcpToken, apiToken, bothToken, vaultToken string

	BeforeAll(func() {
		ns = cp.NewNamespace("mcp-aud-")
		mcpToken = saToken(ns, "agent", auth.DefaultTokenAudience)
		apiToken = saToken(ns, "agent")
		bothToken = saToken(ns, "agent", auth.DefaultTokenAudience, cp.Config.Host)
		vaultToken = saToken(ns, "agent", "https://vault.example")
	})

	kubeServer := func(extra ...string) string {
		GinkgoHelper()
		return startServer(append([]string{"--backend", "kubernetes", "--kubeconfig", adminKubeconfig, "--namespace", ns,
			"--http", "127.0.0.1:0", "--auth", "kubernetes"}, extra...)...)
	}

	It("accepts a code-sandbox-mcp token and refuses an API-server-audience token by default", func(ctx SpecContext) {
		url := kubeServer()
		code, _, body := initialize(ctx, url, mcpToken)
		Expect(code).To(Equal(http.StatusOK), "a token for audience code-sandbox-mcp: %s", body)
		code, _, body = initialize(ctx, url, bothToken)
		Expect(code).To(Equal(http.StatusOK), "a token for code-sandbox-mcp and another audience: %s", body)

		code, challenge, body := initialize(ctx, url, apiToken)
		Expect(code).To(Equal(http.StatusUnauthorized), "an API-server-audience token was not refused: %s", body)
		Expect(challenge).To(ContainSubstring(`error="invalid_token"`))
		code, _, _ = initialize(ctx, url, vaultToken)
		Expect(code).To(Equal(http.StatusUnauthorized), "a token for another service was accepted")
	}, NodeTimeout(2*time.Minute))

	It("accepts an API-server-audience token only with --accept-apiserver-audience", func(ctx SpecContext) {
		url := kubeServer("--accept-apiserver-audience")
		for name, tok := range map[string]string{"API server": apiToken, "code-sandbox-mcp": mcpToken, "both": bothToken} {
			code, _, body := initialize(ctx, url, tok)
			Expect(code).To(Equal(http.StatusOK), "the %s audience token was refused with --accept-apiserver-audience: %s", name, body)
		}
		code, _, _ := initialize(ctx, url, vaultToken)
		Expect(code).To(Equal(http.StatusUnauthorized), "a token for another service was accepted with --accept-apiserver-audience")
		code, _, _ = initialize(ctx, url, "not-a-token-at-all-not-a-token")
		Expect(code).To(Equal(http.StatusUnauthorized))
	}, NodeTimeout(2*time.Minute))

	It("requires --token-audience instead of the default when it is given", func(ctx SpecContext) {
		url := kubeServer("--token-audience", "https://vault.example")
		code, _, body := initialize(ctx, url, vaultToken)
		Expect(code).To(Equal(http.StatusOK), "a token for --token-audience: %s", body)
		code, _, _ = initialize(ctx, url, mcpToken)
		Expect(code).To(Equal(http.StatusUnauthorized), "the default audience still counted after --token-audience replaced it")
		code, _, _ = initialize(ctx, url, apiToken)
		Expect(code).To(Equal(http.StatusUnauthorized))
	}, NodeTimeout(2*time.Minute))
})

// On the docker backend --auth kubernetes authorizes every caller: RBAC on
// --namespace, or an explicit allow-list. A valid cluster token alone is not
// enough.
var _ = Describe("--auth kubernetes on the docker backend", Ordered, func() {
	var ns, otherNS string

	BeforeAll(func() {
		ns = cp.NewNamespace("mcp-docker-")
		otherNS = cp.NewNamespace("mcp-other-")
	})

	dockerServer := func(extra ...string) string {
		GinkgoHelper()
		return startServer(append([]string{"--backend", "docker", "--kubeconfig", reviewerKubeconfig,
			"--http", "127.0.0.1:0", "--auth", "kubernetes",
			"--default-image", testenv.BusyboxImage, "--pull-policy", "Never"}, extra...)...)
	}

	It("refuses to start without a way to authorize callers, and refuses meaningless combinations", func() {
		for _, args := range [][]string{
			{"--backend", "docker", "--kubeconfig", reviewerKubeconfig, "--http", "127.0.0.1:0", "--auth", "kubernetes"},
			{"--backend", "docker", "--kubeconfig", reviewerKubeconfig, "--http", "127.0.0.1:0", "--auth", "kubernetes", "--namespace", "Not_A_Namespace"},
			{"--backend", "docker", "--kubeconfig", reviewerKubeconfig, "--http", "127.0.0.1:0", "--auth", "kubernetes", "--namespace", ns, "--allow-user", "alice"},
			{"--backend", "kubernetes", "--kubeconfig", adminKubeconfig, "--namespace", ns, "--http", "127.0.0.1:0", "--auth", "kubernetes", "--allow-group", "devs"},
			{"--backend", "docker", "--http", "127.0.0.1:0", "--auth", "none", "--accept-apiserver-audience"},
			{"--backend", "docker", "--http", "127.0.0.1:0", "--auth", "none", "--allow-user", "alice"},
			{"--backend", "docker", "--allow-user", "alice"},
			{"--backend", "docker", "--kubeconfig", reviewerKubeconfig, "--http", "127.0.0.1:0", "--auth", "kubernetes", "--namespace", ns, "--token-audience="},
		} {
			err := startupError(args...)
			Expect(err).To(HaveOccurred(), "started with %q", args)
			Expect(isUsageError(err)).To(BeTrue(), "%q: want a usage error, got %v", args, err)
		}
	})

	It("admits only callers RBAC lets create sandboxes in --namespace, and they can use sandboxes", func(ctx SpecContext) {
		testenv.RequireDocker(testenv.BusyboxImage)
		cp.CreateClusterRole("mcp-test-sandbox-creator", rbacv1.PolicyRule{
			APIGroups: []string{sandboxv1alpha1.GroupVersion.Group}, Resources: []string{"sandboxes"}, Verbs: []string{"create"}})
		cp.CreateClusterRole("mcp-test-sandbox-viewer", rbacv1.PolicyRule{
			APIGroups: []string{sandboxv1alpha1.GroupVersion.Group}, Resources: []string{"sandboxes"}, Verbs: []string{"get", "list", "watch"}})
		aud := auth.DefaultTokenAudience
		outsider := saToken(ns, "outsider", aud)
		viewer := saToken(ns, "viewer", aud)
		cp.Bind(ns, "mcp-test-sandbox-viewer", testenv.ServiceAccountSubject(ns, "viewer"))
		elsewhere := saToken(otherNS, "elsewhere", aud)
		cp.Bind(otherNS, "mcp-test-sandbox-creator", testenv.ServiceAccountSubject(otherNS, "elsewhere"))
		agent := saToken(ns, "agent", aud)
		cp.Bind(ns, "mcp-test-sandbox-creator", testenv.ServiceAccountSubject(ns, "agent"))

		url := dockerServer("--namespace", ns)
		for name, tok := range map[string]string{"no RBAC": outsider, "only get/list": viewer, "create in another namespace": elsewhere} {
			code, _, body := initialize(ctx, url, tok)
			Expect(code).To(Equal(http.StatusForbidden), "a caller with %s was not refused: %s", name, body)
			Expect(body).To(And(ContainSubstring("may not create sandboxes"), ContainSubstring(`"`+ns+`"`), ContainSubstring("sandbox.code-sandbox.dev")),
				"the refusal of a caller with %s does not name the missing permission", name)
		}
		code, _, body := initialize(ctx, url, saToken(ns, "agent"))
		Expect(code).To(Equal(http.StatusUnauthorized), "the permitted caller's API-server-audience token was accepted: %s", body)

		s := connect(ctx, url, agent)
		res, text := callTool(ctx, s, "sandbox_initialize", nil)
		Expect(res.IsError).To(BeFalse(), text)
		id, _ := res.StructuredContent.(map[string]any)["container_id"].(string)
		Expect(id).NotTo(BeEmpty(), text)
		res, text = callTool(ctx, s, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"echo hello-from-rbac"}})
		Expect(res.IsError).To(BeFalse(), text)
		Expect(text).To(ContainSubstring("hello-from-rbac"))
		res, text = callTool(ctx, s, "sandbox_stop", map[string]any{"container_id": id})
		Expect(res.IsError).To(BeFalse(), text)
	}, NodeTimeout(3*time.Minute))

	It("admits exactly the users and groups of --allow-user and --allow-group, without RBAC", func(ctx SpecContext) {
		aud := auth.DefaultTokenAudience
		alice := saToken(ns, "alice", aud)
		bob := saToken(ns, "bob", aud)
		carol := saToken(otherNS, "carol", aud)
		url := dockerServer("--allow-user", "system:serviceaccount:"+ns+":alice", "--allow-group", "system:serviceaccounts:"+otherNS)

		code, _, body := initialize(ctx, url, alice)
		Expect(code).To(Equal(http.StatusOK), "the allowed user was refused: %s", body)
		code, _, body = initialize(ctx, url, carol)
		Expect(code).To(Equal(http.StatusOK), "a member of the allowed group was refused: %s", body)
		code, _, body = initialize(ctx, url, bob)
		Expect(code).To(Equal(http.StatusForbidden), "a caller on no allow-list was admitted: %s", body)
		Expect(body).To(ContainSubstring("--allow-user"))
		s := connect(ctx, url, alice)
		res, text := callTool(ctx, s, "list_sandboxes", nil)
		Expect(res.IsError).To(BeFalse(), text)
	}, NodeTimeout(2*time.Minute))
})
