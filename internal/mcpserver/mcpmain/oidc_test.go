/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package mcpmain

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/kubebackend"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

// --auth oidc against a real OpenID Connect issuer: envtest's
// kube-apiserver, whose service-account issuer publishes discovery
// (/.well-known/openid-configuration) and keys (/openid/v1/jwks) and whose
// TokenRequest API mints JWTs for any audience we ask. Its issuer is
// https://127.0.0.1:PORT/, what --oidc-issuer-url must then be, and its
// certificate is envtest's CA, what --oidc-ca-file gets. Nothing is mocked:
// the server discovers the issuer, fetches its keys and checks real
// signatures.
//
// A token's sub is system:serviceaccount:NS:NAME; under --auth oidc it
// becomes the Kubernetes user oidc:system:serviceaccount:NS:NAME, which is
// not the ServiceAccount: RBAC granted to the ServiceAccount counts for
// nothing here.
var _ = Describe("--auth oidc against the API server's service-account issuer", Ordered, func() {
	var (
		issuer, caFile string
		tokenNS, teamA string
		defaultNS      string
	)

	// oidcToken is a token from the issuer for ServiceAccount tokenNS/name
	// with audiences.
	oidcToken := func(name string, audiences ...string) string {
		GinkgoHelper()
		return tokenFrom(cp, tokenNS, name, audiences...)
	}
	oidcUser := func(name string) string { return "oidc:system:serviceaccount:" + tokenNS + ":" + name }

	BeforeAll(func() {
		issuer = cp.Env.ControlPlane.APIServer.SecureServing.URL("https", "/").String()
		caFile = filepath.Join(GinkgoT().TempDir(), "issuer-ca.crt")
		Expect(os.WriteFile(caFile, cp.Config.CAData, 0o600)).To(Succeed())
		// What a cluster does to publish its issuer to outside relying
		// parties: discovery and keys readable without credentials.
		cp.BindCluster("system:service-account-issuer-discovery", rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:unauthenticated"})
		tokenNS = cp.NewNamespace("oidc-tokens-")
		teamA = cp.NewNamespace("oidc-team-a-")
		defaultNS = cp.NewNamespace("oidc-default-")
		cp.CreateClusterRole("oidc-test-sandbox-user", rbacv1.PolicyRule{
			APIGroups: []string{sandboxv1alpha1.GroupVersion.Group}, Resources: []string{"sandboxes"},
			Verbs: []string{"create", "get", "list", "watch", "delete"}})
	})

	oidcServer := func(extra ...func(*Config)) string {
		GinkgoHelper()
		return startServer(append([]func(*Config){onHTTP("127.0.0.1:0", "oidc"), func(o *Config) {
			o.Backend, o.Kubeconfig, o.Namespace, o.ReadyTimeout = "kubernetes", adminKubeconfig, defaultNS, 5*time.Second
			o.OIDC.IssuerURL, o.OIDC.CAFile = issuer, caFile
			o.ScopesSupported = []string{"mcp"}
		}}, extra...)...)
	}

	It("answers a request without a token with 401 and a challenge whose metadata URL serves the resource's metadata", func(ctx SpecContext) {
		url := oidcServer()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(initializeBody))
		Expect(err).NotTo(HaveOccurred())
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		Expect(err).NotTo(HaveOccurred())
		resp.Body.Close()
		Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized))
		challenge := resp.Header.Get("WWW-Authenticate")
		m := regexp.MustCompile(`^Bearer resource_metadata="([^"]+)", scope="mcp"$`).FindStringSubmatch(challenge)
		Expect(m).NotTo(BeNil(), "challenge %q", challenge)

		// The metadata needs no token (none is sent).
		mresp, err := http.Get(m[1])
		Expect(err).NotTo(HaveOccurred())
		defer mresp.Body.Close()
		Expect(mresp.StatusCode).To(Equal(http.StatusOK))
		Expect(mresp.Header.Get("Content-Type")).To(Equal("application/json"))
		var meta struct {
			Resource             string   `json:"resource"`
			AuthorizationServers []string `json:"authorization_servers"`
			ScopesSupported      []string `json:"scopes_supported"`
			BearerMethods        []string `json:"bearer_methods_supported"`
		}
		body, err := io.ReadAll(mresp.Body)
		Expect(err).NotTo(HaveOccurred())
		Expect(json.Unmarshal(body, &meta)).To(Succeed(), string(body))
		Expect(meta.Resource).To(Equal(url), "RFC 9728: the metadata's resource must be the URL the client used")
		Expect(meta.AuthorizationServers).To(Equal([]string{issuer}))
		Expect(meta.ScopesSupported).To(Equal([]string{"mcp"}))
		Expect(meta.BearerMethods).To(Equal([]string{"header"}))
		// RFC 9728 section 3.1: the path-suffixed form for /mcp; the bare
		// form is served too, for clients that try it first.
		Expect(m[1]).To(HaveSuffix("/.well-known/oauth-protected-resource/mcp"))
		bare, err := http.Get(strings.TrimSuffix(m[1], "/mcp"))
		Expect(err).NotTo(HaveOccurred())
		bare.Body.Close()
		Expect(bare.StatusCode).To(Equal(http.StatusOK))
	}, NodeTimeout(2*time.Minute))

	It("takes a good token to a prefixed user, maps it to its namespace, and authorizes it there by RBAC", func(ctx SpecContext) {
		url := oidcServer(func(o *Config) {
			o.OIDC.NamespaceClaim = "sub"
			o.OIDC.Namespaces = map[string]string{"system:serviceaccount:" + tokenNS + ":alice": teamA}
		})
		cp.Bind(teamA, "oidc-test-sandbox-user", testenv.UserSubject(oidcUser("alice")))
		// bob is mapped to no namespace (so he gets --namespace), and only
		// his ServiceAccount, not his OIDC user, has RBAC there.
		cp.Bind(defaultNS, "oidc-test-sandbox-user", testenv.ServiceAccountSubject(tokenNS, "bob"))
		alice := oidcToken("alice", url)
		bob := oidcToken("bob", url)

		code, _, body := initialize(ctx, url, alice)
		Expect(code).To(Equal(http.StatusOK), body)
		s := connect(ctx, url, alice)
		res, text := callTool(ctx, s, "list_sandboxes", nil)
		Expect(res.IsError).To(BeFalse(), "alice may list sandboxes in her mapped namespace %s: %s", teamA, text)

		// sandbox_initialize creates her Sandbox in teamA (no manager runs
		// here, so it never becomes Ready; the Sandbox is what counts).
		initDone := make(chan string, 1)
		go func() {
			defer GinkgoRecover()
			_, text := callTool(ctx, s, "sandbox_initialize", nil)
			initDone <- text
		}()
		Eventually(func(g Gomega) {
			var list sandboxv1alpha1.SandboxList
			g.Expect(cp.Client.List(ctx, &list, client.InNamespace(teamA))).To(Succeed())
			g.Expect(list.Items).To(HaveLen(1))
			g.Expect(list.Items[0].Annotations).To(HaveKeyWithValue(kubebackend.AnnotationIdentity, "kube:"+oidcUser("alice")))
		}).WithContext(ctx).WithTimeout(20 * time.Second).Should(Succeed())
		var elsewhere sandboxv1alpha1.SandboxList
		Expect(cp.Client.List(ctx, &elsewhere, client.InNamespace(defaultNS))).To(Succeed())
		Expect(elsewhere.Items).To(BeEmpty(), "alice's Sandbox went to --namespace, not her mapped one")
		Eventually(initDone).WithTimeout(time.Minute).Should(Receive())

		// bob's token is good, but the ServiceAccount's RBAC is not his.
		sb := connect(ctx, url, bob)
		res, text = callTool(ctx, sb, "list_sandboxes", nil)
		Expect(res.IsError).To(BeTrue(), "an OIDC user got the RBAC of the ServiceAccount its sub names: %s", text)
		Expect(text).To(And(ContainSubstring("may not list"), ContainSubstring(defaultNS)))
	}, NodeTimeout(3*time.Minute))

	It("refuses a token for the API server's audience, for another resource, or from another issuer", func(ctx SpecContext) {
		url := oidcServer()
		cases := map[string]string{
			"the API server's default audience":  oidcToken("carol"),
			"another resource on this host":      oidcToken("carol", strings.TrimSuffix(url, "/mcp")+"/other-mcp"),
			"the resource URL with a trailing /": oidcToken("carol", url+"/"),
			"another resource elsewhere":         oidcToken("carol", "https://mcp.example.com/mcp"),
			"no JWT at all":                      "not-a-jwt-not-a-jwt-not-a-jwt",
		}
		// Another issuer: a second API server, with keys of its own, minting
		// a token for exactly this resource.
		other := testenv.StartControlPlane()
		DeferCleanup(other.Stop)
		cases["another issuer, same audience"] = tokenFrom(other, "default", "carol", url)
		for name, tok := range cases {
			code, challenge, body := initialize(ctx, url, tok)
			Expect(code).To(Equal(http.StatusUnauthorized), "%s: %s", name, body)
			Expect(challenge).To(And(HavePrefix(`Bearer resource_metadata="`), ContainSubstring(`error="invalid_token"`)), name)
		}
		code, _, body := initialize(ctx, url, oidcToken("carol", url))
		Expect(code).To(Equal(http.StatusOK), "the same caller's token for this resource: %s", body)
	}, NodeTimeout(3*time.Minute))

	It("on the docker backend admits the OIDC users RBAC lets create sandboxes in --namespace, and they can use sandboxes", func(ctx SpecContext) {
		testenv.RequireDocker(testenv.BusyboxImage)
		url := oidcServer(func(o *Config) {
			o.Backend, o.Kubeconfig, o.DefaultImage, o.PullPolicy = "docker", reviewerKubeconfig, testenv.BusyboxImage, "Never"
		})
		cp.Bind(defaultNS, "oidc-test-sandbox-user", testenv.UserSubject(oidcUser("erin")))
		code, _, body := initialize(ctx, url, oidcToken("frank", url))
		Expect(code).To(Equal(http.StatusForbidden), "an OIDC user without RBAC in --namespace was admitted: %s", body)
		Expect(body).To(ContainSubstring("may not create sandboxes"))

		s := connect(ctx, url, oidcToken("erin", url))
		res, text := callTool(ctx, s, "sandbox_initialize", nil)
		Expect(res.IsError).To(BeFalse(), text)
		id, _ := res.StructuredContent.(map[string]any)["container_id"].(string)
		Expect(id).NotTo(BeEmpty(), text)
		res, text = callTool(ctx, s, "sandbox_exec", map[string]any{"container_id": id, "commands": []string{"echo hello-from-oidc"}})
		Expect(res.IsError).To(BeFalse(), text)
		Expect(text).To(ContainSubstring("hello-from-oidc"))
		res, text = callTool(ctx, s, "sandbox_stop", map[string]any{"container_id": id})
		Expect(res.IsError).To(BeFalse(), text)
	}, NodeTimeout(3*time.Minute))

	It("refuses an expired token", func(ctx SpecContext) {
		// TokenRequest mints tokens for ten minutes at least, so the
		// server's clock runs two hours ahead instead.
		oidcClock = func() time.Time { return time.Now().Add(2 * time.Hour) }
		DeferCleanup(func() { oidcClock = nil })
		url := oidcServer()
		tok := oidcToken("dave", url)
		code, challenge, body := initialize(ctx, url, tok)
		Expect(code).To(Equal(http.StatusUnauthorized), body)
		Expect(challenge).To(ContainSubstring(`error="invalid_token"`))
	}, NodeTimeout(2*time.Minute))

	It("refuses configurations that would let a claim pick a namespace or a reserved name", func() {
		base := func(o *Config) {
			o.Backend, o.Kubeconfig, o.Namespace = "kubernetes", adminKubeconfig, defaultNS
			o.OIDC.IssuerURL, o.OIDC.CAFile = issuer, caFile
		}
		oidc := onHTTP("127.0.0.1:0", "oidc")
		for name, mods := range map[string][]func(*Config){
			"no --oidc-issuer-url":      {oidc, func(o *Config) { base(o); o.OIDC.IssuerURL = "" }},
			"an http issuer":            {oidc, func(o *Config) { base(o); o.OIDC.IssuerURL = "http://127.0.0.1:1/" }},
			"a system: username prefix": {oidc, func(o *Config) { base(o); o.OIDC.UsernamePrefix = "system:serviceaccount:" }},
			"a system: groups prefix":   {oidc, func(o *Config) { base(o); o.OIDC.GroupsPrefix = "system:" }},
			"a namespace claim, no map": {oidc, func(o *Config) { base(o); o.OIDC.NamespaceClaim = "tenant" }},
			"a map, no namespace claim": {oidc, func(o *Config) { base(o); o.OIDC.Namespaces = map[string]string{"a": teamA} }},
			"a map to a bad namespace": {oidc, func(o *Config) {
				base(o)
				o.OIDC.NamespaceClaim, o.OIDC.Namespaces = "t", map[string]string{"a": "Not_A_NS"}
			}},
			"a namespace map on docker": {oidc, func(o *Config) {
				base(o)
				o.Backend, o.OIDC.NamespaceClaim, o.OIDC.Namespaces = "docker", "t", map[string]string{"a": teamA}
			}},
			"--oidc-* without --auth oidc":    {loopbackNoAuth, func(o *Config) { o.OIDC.IssuerURL = issuer }},
			"--oidc-* over stdio":             {func(o *Config) { o.OIDC.IssuerURL = issuer }},
			"--scope over stdio":              {func(o *Config) { o.ScopesSupported = []string{"mcp"} }},
			"a scope with a quote":            {oidc, func(o *Config) { base(o); o.ScopesSupported = []string{`a"b`} }},
			"--namespace-from-serviceaccount": {oidc, func(o *Config) { base(o); o.NamespaceFromServiceAccount = true }},
		} {
			err := startupError(mods...)
			Expect(err).To(HaveOccurred(), "started with %s", name)
			Expect(isUsageError(err)).To(BeTrue(), "%s: want a usage error, got %v", name, err)
		}
	})
})

// tokenFrom mints a token of ServiceAccount ns/name (created if missing)
// on control plane c for audiences (none: the API server's own).
func tokenFrom(c *testenv.ControlPlane, ns, name string, audiences ...string) string {
	GinkgoHelper()
	ctx := context.Background()
	err := c.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
	if !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred())
	}
	var aud []string
	for _, a := range audiences {
		if a != "" {
			aud = append(aud, a)
		}
	}
	tr, err := c.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: aud, ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	return tr.Status.Token
}
