//go:build e2e

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// SandboxQuota end to end: the suite's `manager --role control-plane` (the
// operator's control-plane component, with its self-managed certificate),
// registered with kube-apiserver through config/dev/operator's
// ValidatingWebhookConfiguration (config/webhook's, pointed at 127.0.0.1
// instead of a Service), and an agent that only ever sees the MCP server
// (--backend kubernetes --auth kubernetes). It proves that the API server
// calls the webhook, that a refusal reaches the model as a tool error with
// the quota's own words, that usage is released on delete, and that the
// webhook fails closed without blocking deletes.
var _ = Describe("SandboxQuota through the admission webhook and code-sandbox-mcp", Ordered, func() {
	const (
		// A manager of its own (see mcp_kube_test.go); the MCP server and
		// the Sandboxes created with kubectl are pinned to it.
		quotaNode = "e2e-quota-node"
		// The Sandboxes' namespace, the only one with a SandboxQuota.
		quotaNS    = "quota-e2e"
		certSecret = "code-sandbox-webhook-server-cert"
		quotaName  = "team-quota"
		webhookErr = `admission webhook "sandbox-quota.code-sandbox.dev" denied the request: `
	)
	var (
		node  *managerProcess
		token string
		sess  *mcp.ClientSession
	)

	// sandboxYAML is a Sandbox the quota admits, pinned to quotaNode.
	sandboxYAML := func(name, image string) string {
		return fmt.Sprintf(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: Sandbox
metadata:
  name: %s
  namespace: %s
spec:
  image: %s
  imagePullPolicy: Never
  nodeName: %s
  activeDeadlineSeconds: 600
`, name, quotaNS, image, quotaNode)
	}
	createSandbox := func(ctx context.Context, name, image string, extra ...string) (string, error) {
		return runWithStdin(ctx, repoRoot, strings.NewReader(sandboxYAML(name, image)), "kubectl",
			append([]string{"--kubeconfig", kubeconfig, "create", "-f", "-"}, extra...)...)
	}
	quotaUsed := func(ctx context.Context) (string, error) {
		return kubectl(ctx, "get", "sandboxquota", quotaName, "-n", quotaNS, "-o", "jsonpath={.status.used.sandboxes}")
	}
	sandboxNames := func(ctx context.Context) (string, error) {
		out, err := kubectl(ctx, "get", "sandboxes", "-n", quotaNS, "-o", "name")
		return strings.TrimSpace(out), err
	}

	// startMCP starts code-sandbox-mcp (kubernetes backend, ServiceAccount
	// tokens) with extra flags and connects to it as ServiceAccount agent.
	// It is stopped, deleting its Sandboxes, when the calling node ends.
	startMCP := func(ctx context.Context, args ...string) *mcp.ClientSession {
		GinkgoHelper()
		url, _ := startKubeMCPHTTP(append([]string{"--backend", "kubernetes", "--kubeconfig", kubeconfig,
			"--node-name", quotaNode, "--default-image", sampleImage, "--pull-policy", "Never",
			"--ready-timeout", "90s", "--max-lifetime", "1h",
			"--http", "127.0.0.1:0", "--auth", "kubernetes"}, args...)...)
		sess := connectKubeMCP(ctx, url, token, "e2e-quota", nil)
		return sess
	}

	BeforeAll(func(ctx SpecContext) {
		Expect(removeContainersOf(ctx, quotaNode)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			Expect(removeContainersOf(ctx, quotaNode)).To(Succeed())
		}, NodeTimeout(time.Minute))

		By("starting a manager that serves the node API on loopback")
		var err error
		node, err = startLoopbackNode(quotaNode, filepath.Join(workDir, "quota-node-state"))
		Expect(err).NotTo(HaveOccurred())
		// Registered before the MCP server's cleanups, so it runs after
		// them: the MCP server deletes its Sandboxes on the
		// way out, which needs this manager to release the finalizers.
		DeferCleanup(func() error { return node.stop(15 * time.Second) })

		_, err = kubectl(ctx, "create", "namespace", quotaNS)
		Expect(err).NotTo(HaveOccurred())
		// No wait: envtest runs no namespace controller.
		DeferCleanup(func(ctx SpecContext) {
			_, _ = kubectl(ctx, "delete", "namespace", quotaNS, "--ignore-not-found", "--wait=false")
		}, NodeTimeout(time.Minute))

		By("granting ServiceAccount agent the shipped sandbox-editor-role")
		_, err = kubectl(ctx, "create", "serviceaccount", "agent", "-n", quotaNS)
		Expect(err).NotTo(HaveOccurred())
		_, err = kubectl(ctx, "create", "rolebinding", "agent-editor", "-n", quotaNS,
			"--clusterrole="+editorRole, "--serviceaccount="+quotaNS+":agent")
		Expect(err).NotTo(HaveOccurred())
		out, err := kubectl(ctx, "create", "token", "agent", "-n", quotaNS, "--duration=1h", "--audience", "code-sandbox-mcp")
		Expect(err).NotTo(HaveOccurred())
		token = strings.TrimSpace(out)

		By("creating a SandboxQuota of one Sandbox")
		_, err = runWithStdin(ctx, repoRoot, strings.NewReader(fmt.Sprintf(`apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: SandboxQuota
metadata:
  name: %s
  namespace: %s
spec:
  hard:
    sandboxes: 1
  maxActiveDeadlineSeconds: 3600
  allowedImages:
  - code-sandbox-test/*
`, quotaName, quotaNS)), "kubectl", "--kubeconfig", kubeconfig, "apply", "-f", "-")
		Expect(err).NotTo(HaveOccurred())

		By("checking the webhook's self-managed certificate")
		out, err = kubectl(ctx, "get", "secret", certSecret, "-n", operatorNamespace, "-o", "jsonpath={.type}")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(Equal("kubernetes.io/tls"))

		By("waiting until the API server calls the webhook (a dry-run create comes back refused by the quota)")
		Eventually(func() string {
			_, err := createSandbox(ctx, "probe", "probe/not-allowed:1", "--dry-run=server")
			if err == nil {
				return "admitted"
			}
			return err.Error()
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(time.Second).
			Should(ContainSubstring(webhookErr + `sandbox quota "` + quotaName + `" does not allow image "probe/not-allowed:1"`))

		By("waiting until the quota has counted its usage")
		Eventually(func() (string, error) {
			return kubectl(ctx, "get", "sandboxquota", quotaName, "-n", quotaNS, "-o", "jsonpath={.metadata.generation}/{.status.observedGeneration} {.status.summary}")
		}).WithContext(ctx).WithTimeout(time.Minute).Should(Equal("1/1 sandboxes: 0/1"))

		By("starting the MCP server with ServiceAccount tokens")
		sess = startMCP(ctx, "--namespace", quotaNS)
	}, NodeTimeout(5*time.Minute))

	JustBeforeEach(func() {
		Expect(node.exitErr()).NotTo(HaveOccurred(), "the quota node's manager exited")
	})

	var first string

	It("admits the first sandbox and refuses the second with the quota's numbers", func(ctx SpecContext) {
		first = kmcpInit(ctx, sess, nil)
		Eventually(quotaUsed).WithContext(ctx).WithTimeout(30 * time.Second).Should(Equal("1"))

		res := kmcpCall(ctx, sess, "sandbox_initialize", map[string]any{})
		Expect(res.IsError).To(BeTrue(), kmcpText(res))
		Expect(kmcpText(res)).To(ContainSubstring(webhookErr +
			`sandbox quota "` + quotaName + `" exceeded: sandboxes: requested 1, used 1, limit 1 (1 over)`))
		// The advice that goes with a used-up quota.
		Expect(kmcpText(res)).To(ContainSubstring("sandbox_stop"))
		Expect(sandboxNames(ctx)).To(Equal("sandbox.sandbox.code-sandbox.dev/"+first), "the refused create left a Sandbox behind")

		Eventually(func() (string, error) {
			return kubectl(ctx, "get", "sandboxquota", quotaName, "-n", quotaNS, "-o",
				`jsonpath={.status.summary} {.status.conditions[?(@.type=="Exhausted")].status}`)
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Equal("sandboxes: 1/1 True"))
	}, NodeTimeout(3*time.Minute))

	It("tells the model which image the quota refuses and which it allows", func(ctx SpecContext) {
		res := kmcpCall(ctx, sess, "sandbox_initialize", map[string]any{"image": "evil/x:1"})
		Expect(res.IsError).To(BeTrue(), kmcpText(res))
		Expect(kmcpText(res)).To(ContainSubstring(webhookErr +
			`sandbox quota "` + quotaName + `" does not allow image "evil/x:1" (docker.io/evil/x:1); allowed images: code-sandbox-test/*`))
		// A rule, not usage: stopping sandboxes would not help.
		Expect(kmcpText(res)).NotTo(ContainSubstring("sandbox_stop"))
	}, NodeTimeout(time.Minute))

	It("releases the quota when the sandbox is stopped", func(ctx SpecContext) {
		Expect(first).NotTo(BeEmpty(), "the first spec created no sandbox")
		res := kmcpCall(ctx, sess, "sandbox_stop", map[string]any{"container_id": first})
		Expect(res.IsError).To(BeFalse(), kmcpText(res))
		Eventually(quotaUsed).WithContext(ctx).WithTimeout(30 * time.Second).Should(Equal("0"))

		second := kmcpInit(ctx, sess, nil)
		Expect(second).NotTo(Equal(first))
		res = kmcpCall(ctx, sess, "sandbox_stop", map[string]any{"container_id": second})
		Expect(res.IsError).To(BeFalse(), kmcpText(res))
		Eventually(quotaUsed).WithContext(ctx).WithTimeout(30 * time.Second).Should(Equal("0"))
	}, NodeTimeout(3*time.Minute))

	It("serves each ServiceAccount in its own namespace, under that namespace's quota (--namespace-from-serviceaccount)", func(ctx SpecContext) {
		// One shared server whose --namespace is somewhere else entirely:
		// agent, a ServiceAccount of quotaNS, still lands in quotaNS.
		shared := startMCP(ctx, "--namespace", "default", "--namespace-from-serviceaccount")
		id := kmcpInit(ctx, shared, nil)
		Expect(sandboxNames(ctx)).To(Equal("sandbox.sandbox.code-sandbox.dev/" + id))
		Eventually(quotaUsed).WithContext(ctx).WithTimeout(30 * time.Second).Should(Equal("1"))
		out, err := kubectl(ctx, "get", "sandboxes", "-n", "default", "-o", "name")
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.TrimSpace(out)).To(BeEmpty(), "nothing goes to --namespace for a ServiceAccount caller")

		res := kmcpCall(ctx, shared, "sandbox_initialize", map[string]any{})
		Expect(res.IsError).To(BeTrue(), kmcpText(res))
		Expect(kmcpText(res)).To(ContainSubstring(`sandbox quota "` + quotaName + `" exceeded: sandboxes: requested 1, used 1, limit 1 (1 over)`))

		res = kmcpCall(ctx, shared, "sandbox_stop", map[string]any{"container_id": id})
		Expect(res.IsError).To(BeFalse(), kmcpText(res))
		Eventually(quotaUsed).WithContext(ctx).WithTimeout(30 * time.Second).Should(Equal("0"))
	}, NodeTimeout(3*time.Minute))

	It("fails closed while the webhook is down, but Sandboxes can still be deleted", func(ctx SpecContext) {
		By("creating a Sandbox while the webhook is up")
		_, err := createSandbox(ctx, "kept", sampleImage)
		Expect(err).NotTo(HaveOccurred())
		kube().WaitSandboxesReady(ctx, quotaNS, 90*time.Second, nil, "kept")

		By("stopping the webhook (the operator's manager --role control-plane)")
		Expect(operator.stop(15 * time.Second)).To(Succeed())
		// Whatever happens below, the window in which creates fail ends
		// with this spec: the operator is started again.
		restarted := false
		DeferCleanup(func(ctx SpecContext) {
			if !restarted {
				var err error
				operator, err = startOperator(ctx)
				Expect(err).NotTo(HaveOccurred())
			}
		}, NodeTimeout(3*time.Minute))

		_, err = createSandbox(ctx, "refused", sampleImage)
		Expect(err).To(MatchError(ContainSubstring(`failed calling webhook "sandbox-quota.code-sandbox.dev"`)))
		_, err = kubectl(ctx, "patch", "sandbox", "kept", "-n", quotaNS, "--type=merge", "-p", `{"spec":{"activeDeadlineSeconds":900}}`)
		Expect(err).To(MatchError(ContainSubstring(`failed calling webhook "sandbox-deadline.code-sandbox.dev"`)),
			"a lifetime change must not bypass the quota while the webhook is down")

		res := kmcpCall(ctx, sess, "sandbox_initialize", map[string]any{})
		Expect(res.IsError).To(BeTrue(), kmcpText(res))
		Expect(kmcpText(res)).To(And(ContainSubstring("failed calling webhook"), ContainSubstring("retry")))

		By("deleting the Sandbox: its manager's updates and the delete do not go through the webhook")
		_, err = kubectl(ctx, "delete", "sandbox", "kept", "-n", quotaNS, "--wait", "--timeout=60s")
		Expect(err).NotTo(HaveOccurred())
		Expect(sandboxNames(ctx)).To(BeEmpty())
		Eventually(func() (string, error) {
			return docker(ctx, "ps", "-aq", "--filter", "label="+nodeLabel+"="+quotaNode)
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(BeEmpty())

		By("starting the webhook again: creates work again")
		operator, err = startOperator(ctx)
		Expect(err).NotTo(HaveOccurred())
		restarted = true
		Eventually(func() error {
			_, err := createSandbox(ctx, "after", sampleImage, "--dry-run=server")
			return err
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
	}, NodeTimeout(6*time.Minute))
})
