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

// connect opens an MCP session with token; it is closed when the calling
// node ends.
func connect(ctx context.Context, url, token string) *mcp.ClientSession {
	GinkgoHelper()
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	hc := &http.Client{Transport: mcpclient.Bearer{Token: token, Base: http.DefaultTransport}}
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

	kubeServer := func(extra ...func(*Config)) string {
		GinkgoHelper()
		return startServer(append([]func(*Config){onHTTP("127.0.0.1:0", "kubernetes"), func(o *Config) {
			o.Backend, o.Kubeconfig, o.Namespace = "kubernetes", adminKubeconfig, ns
		}}, extra...)...)
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
		url := kubeServer(func(o *Config) { o.AcceptAPIServerAudience = true })
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
		url := kubeServer(func(o *Config) { o.TokenAudiences = []string{"https://vault.example"} })
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

	dockerServer := func(extra ...func(*Config)) string {
		GinkgoHelper()
		return startServer(append([]func(*Config){onHTTP("127.0.0.1:0", "kubernetes"), func(o *Config) {
			o.Backend, o.Kubeconfig, o.DefaultImage, o.PullPolicy = "docker", reviewerKubeconfig, testenv.BusyboxImage, "Never"
		}}, extra...)...)
	}

	It("refuses to start without a way to authorize callers, and refuses meaningless combinations", func() {
		dockerKube := func(o *Config) {
			o.Backend, o.Kubeconfig, o.HTTPAddr, o.Auth = "docker", reviewerKubeconfig, "127.0.0.1:0", "kubernetes"
		}
		for name, mods := range map[string][]func(*Config){
			"no --namespace and no allow-list": {dockerKube},
			"--namespace Not_A_Namespace":      {dockerKube, func(o *Config) { o.Namespace = "Not_A_Namespace" }},
			"--namespace with --allow-user":    {dockerKube, func(o *Config) { o.Namespace, o.AllowUsers = ns, []string{"alice"} }},
			"--allow-group on the kubernetes backend": {onHTTP("127.0.0.1:0", "kubernetes"), func(o *Config) {
				o.Backend, o.Kubeconfig, o.Namespace, o.AllowGroups = "kubernetes", adminKubeconfig, ns, []string{"devs"}
			}},
			"--accept-apiserver-audience with --auth none": {loopbackNoAuth, func(o *Config) { o.AcceptAPIServerAudience = true }},
			"--allow-user with --auth none":                {loopbackNoAuth, func(o *Config) { o.AllowUsers = []string{"alice"} }},
			"--allow-user over stdio":                      {func(o *Config) { o.AllowUsers = []string{"alice"} }},
			"--token-audience= (none)":                     {dockerKube, func(o *Config) { o.Namespace, o.TokenAudiences = ns, nil }},
		} {
			err := startupError(mods...)
			Expect(err).To(HaveOccurred(), "started with %s", name)
			Expect(isUsageError(err)).To(BeTrue(), "%s: want a usage error, got %v", name, err)
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

		url := dockerServer(func(o *Config) { o.Namespace = ns })
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
		url := dockerServer(func(o *Config) {
			o.AllowUsers, o.AllowGroups = []string{"system:serviceaccount:" + ns + ":alice"}, []string{"system:serviceaccounts:" + otherNS}
		})

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
