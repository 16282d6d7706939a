//go:build cluster

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package cluster tests the operator as a platform team runs it: deployed
// with `make deploy` into a real cluster (make kind-up: one control plane
// and two workers, built offline), its manager and Engine DaemonSets,
// webhook and MCP server running as pods with their shipped security
// contexts, probes, ServiceAccount tokens and RBAC. Like test/e2e it
// imports nothing from this module's runtime and drives the system only
// through kubectl, the kubectl plugin, an MCP client and the Docker CLI (in
// the Engine pods, and on this machine for the kind nodes themselves).
//
// Run it with `make test-kind` after
//
//	make kind-up && make kind-deploy
//
// (KUBECONFIG is bin/kind-cluster/kubeconfig). The suite ends with `make
// undeploy` and checks that nothing is left, then deploys again so that the
// cluster is as it found it.
package cluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/framework"
)

const (
	// operatorNS is config/default's namespace; prefix its namePrefix.
	operatorNS = "code-sandbox-system"
	prefix     = "code-sandbox-"

	labelPrefix = framework.LabelPrefix
	nodeLabel   = framework.NodeLabel
	uidLabel    = framework.UIDLabel
	sampleImage = framework.SampleImage
)

var (
	repoRoot   string
	kubeconfig string
	kubectlBin string
	pluginBin  string
	// nodeName is the first worker: specs that need one node pin to it.
	nodeName string
)

func TestCluster(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "code-sandbox-operator on a real cluster")
}

var _ = BeforeSuite(func(ctx SpecContext) {
	var err error
	repoRoot, err = findRepoRoot()
	Expect(err).NotTo(HaveOccurred())
	kubeconfig = os.Getenv("KUBECONFIG")
	if kubeconfig == "" {
		kubeconfig = filepath.Join(repoRoot, "bin", "kind-cluster", "kubeconfig")
	}
	Expect(kubeconfig).To(BeAnExistingFile(), "no cluster: run `make kind-up`")
	kubectlBin = os.Getenv("KUBECTL")
	if kubectlBin == "" {
		kubectlBin = "kubectl"
	}
	pluginBin = filepath.Join(repoRoot, "bin", "kubectl-sandbox")
	Expect(pluginBin).To(BeAnExistingFile(), "run `make build`")

	_, err = run(ctx, "", nil, "docker", "image", "inspect", "--format", "{{.Id}}", sampleImage)
	Expect(err).NotTo(HaveOccurred(), "the sample's image is missing; run `make test-images`")

	_, err = kubectl(ctx, "wait", "--for=condition=Ready", "nodes", "--all", "--timeout=120s")
	Expect(err).NotTo(HaveOccurred())

	By("waiting for the operator's workloads (make kind-deploy)")
	Expect(waitOperatorRollout(ctx)).To(Succeed())
	Expect(discoverNodes(ctx)).To(Succeed())
	nodeName = workers[0]
	By(fmt.Sprintf("sandboxes run on %v (Engine in the operator's pods: %t, kind cluster: %q)", workers, engineMode, kindCluster))
	Expect(loadSandboxImages(ctx, sampleImage)).To(Succeed())
	if kindCluster != "" {
		routeServicesThroughKind(ctx)
	}
}, NodeTimeout(5*time.Minute))

// waitOperatorRollout waits until the manager DaemonSet and the webhook and
// MCP Deployments are rolled out and Ready.
func waitOperatorRollout(ctx context.Context) error {
	// The Engine DaemonSet updates OnDelete (config/engine), which rollout
	// status does not follow: wait for its pods instead.
	if out, _ := kubectl(ctx, "get", "daemonset", "-n", operatorNS, "-l", engineSelector, "-o", "name"); strings.TrimSpace(out) != "" {
		err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			out, err := kubectl(ctx, "get", "daemonset", prefix+"engine", "-n", operatorNS, "-o", "jsonpath={.status.desiredNumberScheduled} {.status.numberReady}")
			f := strings.Fields(out)
			return err == nil && len(f) == 2 && f[0] != "0" && f[0] == f[1], nil
		})
		if err != nil {
			return fmt.Errorf("the Engine DaemonSet's pods are not Ready: %w\n%s", err, describeOperator(ctx))
		}
	}
	for _, w := range []string{"daemonset/" + prefix + "controller-manager", "deployment/" + prefix + "webhook", "deployment/" + prefix + "mcp-server"} {
		if out, err := kubectl(ctx, "rollout", "status", "-n", operatorNS, w, "--timeout=180s"); err != nil {
			return fmt.Errorf("%s is not rolled out: %w\n%s\n%s", w, err, out, describeOperator(ctx))
		}
	}
	if out, err := kubectl(ctx, "wait", "--for=condition=Available", "apiservice/v1alpha1.subresources.sandbox.code-sandbox.dev", "--timeout=120s"); err != nil {
		return fmt.Errorf("the aggregated API is not available: %w\n%s", err, out)
	}
	return nil
}

// describeOperator is what an operator of the cluster would look at.
func describeOperator(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var b strings.Builder
	for _, args := range [][]string{
		{"get", "pods", "-n", operatorNS, "-o", "wide"},
		{"get", "events", "-n", operatorNS, "--sort-by=.lastTimestamp"},
	} {
		out, err := kubectl(ctx, args...)
		fmt.Fprintf(&b, "$ kubectl %s\n%s", strings.Join(args, " "), out)
		if err != nil {
			fmt.Fprintf(&b, "(%v)\n", err)
		}
	}
	return b.String()
}

func describeSandbox(ctx context.Context, ns, name string) string {
	return kube().DescribeSandbox(ctx, ns, name, []string{"logs", "-n", operatorNS, "-l", "app.kubernetes.io/component=manager", "--tail=40"})
}

func findRepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// run runs a command and returns its stdout; the error carries stderr.
func run(ctx context.Context, dir string, stdin io.Reader, name string, args ...string) (string, error) {
	return framework.Run(ctx, dir, stdin, name, args...)
}

// kube is kubectl with the suite's kubeconfig.
func kube() framework.Kubectl {
	return framework.Kubectl{Bin: kubectlBin, Kubeconfig: kubeconfig}
}

func kubectl(ctx context.Context, args ...string) (string, error) {
	return kube().Run(ctx, args...)
}

func kubectlApply(ctx context.Context, yaml string) error {
	return kube().Apply(ctx, yaml)
}

func plugin(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	return run(ctx, "", stdin, pluginBin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
}

func docker(ctx context.Context, args ...string) (string, error) {
	return run(ctx, "", nil, "docker", args...)
}

func mustKubectl(ctx context.Context, args ...string) string {
	GinkgoHelper()
	return kube().Must(ctx, args...)
}

// One ordered tree, so that uninstalling comes last.
var _ = Describe("the operator on a real cluster", Ordered, func() {
	sandboxSpecs()
	mcpSpecs()
	mcpHASpecs()
	longRunSpecs()
	previewSpecs()
	mcpBenchSpecs()
	warmPoolSpecs()
	webhookSpecs()
	benchSpecs()
	engineSpecs()
	multiNodeSpecs()
	snapshotSpecs()
	// Last before undeploy: they stop and restart nodes.
	faultSpecs()

	Describe("make undeploy", Ordered, Label("undeploy"), func() {
		It("leaves no containers, CRDs, webhooks or APIService behind, and deploys again", func(ctx SpecContext) {
			// A Sandbox left running, for undeploy to remove.
			_, _ = kubectl(ctx, "create", "namespace", "cluster-undeploy")
			Expect(kubectlApply(ctx, `apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: Sandbox
metadata:
  name: left
  namespace: cluster-undeploy
spec:
  image: `+sampleImage+`
  imagePullPolicy: Never
  activeDeadlineSeconds: 600
`)).To(Succeed())
			waitSandboxesReady(ctx, "cluster-undeploy", 120*time.Second, "left")
			Expect(containersLeft(ctx)).NotTo(BeEmpty(), "the check below must see the Sandbox's container")

			// The images running now, to deploy the same again below.
			images := []string{"KUBECONFIG=" + kubeconfig,
				"IMG=" + mustKubectl(ctx, "get", "daemonset", prefix+"controller-manager", "-n", operatorNS, "-o", "jsonpath={.spec.template.spec.containers[0].image}"),
				"MCP_IMG=" + mustKubectl(ctx, "get", "deployment", prefix+"mcp-server", "-n", operatorNS, "-o", "jsonpath={.spec.template.spec.containers[0].image}")}
			if engineMode {
				images = append(images, "ENGINE_IMG="+mustKubectl(ctx, "get", "daemonset", engineDS, "-n", operatorNS, "-o", "jsonpath={.spec.template.spec.containers[0].image}"))
			}
			out, err := run(ctx, repoRoot, nil, "make", "undeploy", "KUBECONFIG="+kubeconfig)
			Expect(err).NotTo(HaveOccurred(), out)
			// Whatever is found below, put the operator back for the next run.
			DeferCleanup(func(ctx SpecContext) {
				out, err := run(ctx, repoRoot, nil, "make", append([]string{"deploy"}, images...)...)
				Expect(err).NotTo(HaveOccurred(), out)
				Expect(waitOperatorRollout(ctx)).To(Succeed())
			}, NodeTimeout(5*time.Minute))
			_, _ = kubectl(ctx, "delete", "namespace", "cluster-undeploy", "--wait=false")

			Eventually(func() (string, error) {
				return containersLeft(ctx)
			}).WithContext(ctx).WithTimeout(time.Minute).Should(BeEmpty(), "sandbox containers left on the nodes")
			Expect(mustKubectl(ctx, "get", "crds", "-o", "name")).NotTo(ContainSubstring("code-sandbox.dev"))
			Expect(mustKubectl(ctx, "get", "validatingwebhookconfigurations", "-o", "name")).NotTo(ContainSubstring("code-sandbox"))
			Expect(mustKubectl(ctx, "get", "validatingadmissionpolicies", "-o", "name")).NotTo(ContainSubstring("sandbox"))
			Expect(mustKubectl(ctx, "get", "apiservices", "-o", "name")).NotTo(ContainSubstring("code-sandbox.dev"))
			Expect(mustKubectl(ctx, "get", "clusterroles", "-o", "name")).NotTo(ContainSubstring("code-sandbox-"))
			Eventually(func() (string, error) {
				out, _ := kubectl(ctx, "get", "namespace", operatorNS, "-o", "name", "--ignore-not-found")
				return strings.TrimSpace(out), nil
			}).WithContext(ctx).WithTimeout(2*time.Minute).Should(BeEmpty(), "the operator's namespace is still there")
		}, NodeTimeout(6*time.Minute))
	})
})
