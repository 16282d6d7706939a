/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"testing"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/tier"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	dockerclient "github.com/docker/docker/client"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/nodelease"
)

var (
	cp        *testenv.ControlPlane
	cfg       *rest.Config
	k8sClient client.Client
	scheme    *runtime.Scheme
	docker    *dockerclient.Client

	busyboxImage = testenv.BusyboxImage
	pythonImage  = testenv.PythonImage
)

// Every node name a test uses starts with this, so AfterSuite can remove
// whatever a failed test left behind.
const testNodePrefix = "ctrl-test-"

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	// Under -short (make test-unit) only the specs labelled unit run: the
	// reconcile logic against a fake runtime and a fake API client.
	RunSpecs(t, "Sandbox controller suite (unit + envtest + Docker)", tier.Config()...)
}

var _ = BeforeSuite(func() {
	if !tier.NeedsIntegration() {
		return // unit specs only: no Docker, no API server
	}
	docker = testenv.RequireDocker(busyboxImage, pythonImage)
	cp = testenv.StartControlPlane()
	cfg, k8sClient, scheme = cp.Config, cp.Client, cp.Scheme
})

var _ = AfterSuite(func() {
	if docker != nil {
		testenv.RemoveNodeContainers(docker, testNodePrefix)
	}
	cp.Stop()
})

// testManager is one node's manager running in this process.
type testManager struct {
	node       string
	reconciler *SandboxReconciler
	cancel     context.CancelFunc
	done       chan struct{}
}

// suiteStopGrace is the managers' stop grace period: what a graceful stop
// of a container that ignores SIGTERM waits before it kills.
const suiteStopGrace = time.Second

type managerConfig struct {
	dockerHost       string
	maxSandboxes     int
	orphanGCInterval time.Duration
	history          HistoryDeleter
	// leaseNamespace, when set, runs the node Lease heartbeat there and
	// spreads warm pool members over the nodes holding one.
	leaseNamespace string
	// snapshots, when set, is the node's SandboxSnapshot store.
	snapshots SnapshotStore
	// egressProxy is the node's egress proxy (Options.EgressProxy).
	egressProxy EgressProxy
	// snapshotSpool is where registry restores spool (default: temp dir).
	snapshotSpool string
}

// startManager runs a manager for node (prefixed with testNodePrefix) until
// the test ends or stop is called.
func startManager(node string, mc managerConfig) *testManager {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  CacheOptions(node),
	})
	Expect(err).NotTo(HaveOccurred())
	rt, err := dockerruntime.New(dockerruntime.Options{Host: mc.dockerHost, CallTimeout: 10 * time.Second, PullTimeout: 20 * time.Second})
	Expect(err).NotTo(HaveOccurred())
	if mc.orphanGCInterval == 0 {
		mc.orphanGCInterval = time.Hour
	}
	var liveNodes func(context.Context) ([]string, error)
	if mc.leaseNamespace != "" {
		cs, err := kubernetes.NewForConfig(cfg)
		Expect(err).NotTo(HaveOccurred())
		heartbeat, err := nodelease.Heartbeat(cs, node, mc.leaseNamespace)
		Expect(err).NotTo(HaveOccurred())
		Expect(mgr.Add(manager.RunnableFunc(heartbeat))).To(Succeed())
		leases := &nodelease.Cached{Reader: mgr.GetAPIReader(), Namespace: mc.leaseNamespace, Clock: clock.RealClock{}, TTL: 2 * time.Second}
		liveNodes = leases.Nodes
	}
	r, err := NewSandboxReconciler(mgr.GetClient(), mgr.GetAPIReader(), rt, mgr.GetEventRecorder("sandbox-manager-"+node),
		clock.RealClock{}, Options{
			NodeName:           node,
			MaxSandboxes:       mc.maxSandboxes,
			StopGracePeriod:    suiteStopGrace,
			RetryBackoffBase:   200 * time.Millisecond,
			RetryBackoffMax:    2 * time.Second,
			SkipNameValidation: true,
			History:            mc.history,
			LiveNodes:          liveNodes,
			Snapshots:          mc.snapshots,
			EgressProxy:        mc.egressProxy,
			SnapshotSpoolDir:   mc.snapshotSpool,
		})
	Expect(err).NotTo(HaveOccurred())
	Expect(r.SetupWithManager(mgr, mc.orphanGCInterval)).To(Succeed())

	ctx, cancel := context.WithCancel(context.Background())
	m := &testManager{node: node, reconciler: r, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer GinkgoRecover()
		defer close(m.done)
		defer rt.Close()
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
	DeferCleanup(m.stop)
	return m
}

// stop ends the manager as a crash would: no clean-up of sandboxes.
func (m *testManager) stop() {
	m.cancel()
	Eventually(m.done, 30*time.Second).Should(BeClosed())
}

// newNamespace creates a namespace for one test.
func newNamespace() string {
	GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "sbx-test-"}}
	Expect(k8sClient.Create(context.Background(), ns)).To(Succeed())
	return ns.Name
}

func newSandbox(ns, name, node string, mutate ...func(*sandboxv1alpha1.Sandbox)) *sandboxv1alpha1.Sandbox {
	sbx := &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       sandboxv1alpha1.SandboxSpec{Image: busyboxImage, NodeName: node},
	}
	for _, m := range mutate {
		m(sbx)
	}
	return sbx
}

func createSandbox(sbx *sandboxv1alpha1.Sandbox) *sandboxv1alpha1.Sandbox {
	GinkgoHelper()
	Expect(k8sClient.Create(context.Background(), sbx)).To(Succeed())
	DeferCleanup(func() {
		// Leave nothing behind even if the test failed half-way.
		ctx := context.Background()
		latest := &sandboxv1alpha1.Sandbox{}
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(sbx), latest); err != nil {
			return
		}
		_ = k8sClient.Delete(ctx, latest)
		if len(latest.Finalizers) > 0 {
			latest.Finalizers = nil
			_ = k8sClient.Update(ctx, latest)
		}
	})
	return sbx
}

func getSandbox(key types.NamespacedName) *sandboxv1alpha1.Sandbox {
	GinkgoHelper()
	sbx := &sandboxv1alpha1.Sandbox{}
	Expect(k8sClient.Get(context.Background(), key, sbx)).To(Succeed())
	return sbx
}

// readyReason polls the Ready condition as "Status/Reason" (testenv.ReadyReason).
func readyReason(key types.NamespacedName) func() string {
	return testenv.ReadyReason(k8sClient, key)
}

func waitReady(sbx *sandboxv1alpha1.Sandbox) *sandboxv1alpha1.Sandbox {
	GinkgoHelper()
	return testenv.WaitReady(k8sClient, sbx)
}

// containersOf lists the containers that carry a Sandbox UID label.
func containersOf(uid types.UID) []container.Summary {
	GinkgoHelper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := docker.ContainerList(ctx, container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", dockerruntime.LabelSandboxUID+"="+string(uid)))})
	Expect(err).NotTo(HaveOccurred())
	return list
}

func containerCount(uid types.UID) func() int {
	return func() int { return len(containersOf(uid)) }
}

func isGone(key types.NamespacedName) func() bool {
	return func() bool {
		err := k8sClient.Get(context.Background(), key, &sandboxv1alpha1.Sandbox{})
		return err != nil && client.IgnoreNotFound(err) == nil
	}
}
