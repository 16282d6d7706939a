// Package integration_test drives sandboxclient through the real data path:
// a kube-apiserver (envtest) with the front proxy configured, the operator's
// aggregated API server behind its APIService, the Sandbox reconciler and
// the node API server of one manager (mutual TLS with the operator CA), and
// the node's real Docker Engine. It lives apart from the
// client's unit suite so that that one runs anywhere.
package integration_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/testnode"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/tier"

	dockerclient "github.com/docker/docker/client"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// Every node name starts with this, so that AfterSuite can remove whatever
// a failed test left behind.
const testNodePrefix = "sbxclient-test-"

var (
	cp        *testenv.ControlPlane
	cfg       *rest.Config
	testEnv   *envtest.Environment
	k8sClient client.Client
	rawDocker *dockerclient.Client

	busyboxImage = testenv.BusyboxImage
	nodeName     = fmt.Sprintf("%s%d-%x", testNodePrefix, GinkgoParallelProcess(), time.Now().UnixNano()&0xffff)

	// execRole is the shipped ClusterRole for using Sandboxes.
	execRole string

	node     *testnode.Node
	operator *testnode.Operator
)

func TestIntegration(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "sandboxclient against the node API (envtest + Docker)", tier.Config()...) // -short: only specs labelled unit
}

var _ = BeforeSuite(func() {
	rawDocker = testenv.RequireDocker(busyboxImage)
	cp = testenv.StartControlPlane(testenv.WithAggregation())
	cfg, testEnv, k8sClient = cp.Config, cp.Env, cp.Client

	// The exec ClusterRole as shipped, so that these tests prove it too.
	execRole = cp.CreateShippedClusterRole("sandbox_exec_role.yaml")
	cp.CreateClusterRole("sandbox-reader",
		rbacv1.PolicyRule{APIGroups: []string{sandboxv1alpha1.GroupVersion.Group}, Resources: []string{"sandboxes"}, Verbs: []string{"get"}})
	cp.CreateClusterRole("impersonator",
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"users", "groups"}, Verbs: []string{"impersonate"}})

	// The aggregated API server and the node API as the operator runs
	// them, on loopback.
	operator = testnode.StartOperator(cp)
	node = testnode.Start(cp, operator, testnode.NodeOptions{Name: nodeName})
})

var _ = AfterSuite(func() {
	node.Stop()
	operator.Stop(cp)
	if rawDocker != nil {
		testenv.RemoveNodeContainers(rawDocker, testNodePrefix)
	}
	cp.Stop()
})

func newNamespace() string { return cp.NewNamespace("sbxclient-") }

// createSandbox creates a Sandbox on nodeName and deletes it when the
// enclosing container ends.
func createSandbox(ns, name string, mutate ...func(*sandboxv1alpha1.Sandbox)) *sandboxv1alpha1.Sandbox {
	GinkgoHelper()
	sbx := &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       sandboxv1alpha1.SandboxSpec{Image: busyboxImage, NodeName: nodeName},
	}
	for _, m := range mutate {
		m(sbx)
	}
	Expect(k8sClient.Create(context.Background(), sbx)).To(Succeed())
	DeferCleanup(func() {
		_ = k8sClient.Delete(context.Background(), sbx)
	})
	return sbx
}

// readyState polls the Ready condition as "Status/Reason" (testenv.ReadyReason).
func readyState(sbx *sandboxv1alpha1.Sandbox) func() string {
	return testenv.ReadyReason(k8sClient, client.ObjectKeyFromObject(sbx))
}

// waitReady waits until sbx is Ready and its node API endpoint is
// published, which the client needs.
func waitReady(sbx *sandboxv1alpha1.Sandbox) {
	GinkgoHelper()
	testenv.WaitReady(k8sClient, sbx)
	Eventually(func(g Gomega) string {
		latest := &sandboxv1alpha1.Sandbox{}
		g.Expect(k8sClient.Get(context.Background(), client.ObjectKeyFromObject(sbx), latest)).To(Succeed())
		return latest.Status.NodeAPIEndpoint
	}, testenv.ReadyTimeout, 100*time.Millisecond).ShouldNot(BeEmpty(), "a Ready Sandbox publishes its node API endpoint")
}

// serviceAccountConfig creates a ServiceAccount and returns a rest.Config
// that authenticates as it with a token from the TokenRequest API.
func serviceAccountConfig(ns, name string) *rest.Config {
	return &rest.Config{Host: cfg.Host, BearerToken: cp.ServiceAccountToken(ns, name), TLSClientConfig: rest.TLSClientConfig{CAData: cfg.CAData}}
}

func bind(ns, clusterRole string, subject rbacv1.Subject) { cp.Bind(ns, clusterRole, subject) }

func bindCluster(clusterRole string, subject rbacv1.Subject) { cp.BindCluster(clusterRole, subject) }

func saSubject(ns, name string) rbacv1.Subject { return testenv.ServiceAccountSubject(ns, name) }

func userSubject(name string) rbacv1.Subject { return testenv.UserSubject(name) }
