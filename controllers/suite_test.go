/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package controllers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	dockerclient "github.com/docker/docker/client"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
)

var (
	cfg       *rest.Config
	k8sClient client.Client
	testEnv   *envtest.Environment
	scheme    = runtime.NewScheme()
	docker    *dockerclient.Client

	busyboxImage = envOr("BUSYBOX_IMAGE", "code-sandbox-test/busybox:1")
	pythonImage  = envOr("PYTHON_IMAGE", "code-sandbox-test/python:3")
)

// Every node name a test uses starts with this, so AfterSuite can remove
// whatever a failed test left behind.
const testNodePrefix = "ctrl-test-"

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Sandbox controller suite (envtest + Docker)")
}

func envOr(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))

	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(),
		"KUBEBUILDER_ASSETS is not set: run the suite with `make test`, which provides kube-apiserver and etcd")

	var err error
	docker, err = dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	Expect(err).NotTo(HaveOccurred())
	pingCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = docker.Ping(pingCtx)
	Expect(err).NotTo(HaveOccurred(), "Docker Engine is not answering: run `make docker-up`")
	for _, img := range []string{busyboxImage, pythonImage} {
		_, err := docker.ImageInspect(pingCtx, img)
		Expect(err).NotTo(HaveOccurred(), "test image %s is missing: run `make test-images`", img)
	}

	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(sandboxv1alpha1.AddToScheme(scheme)).To(Succeed())

	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred())
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
})

var _ = AfterSuite(func() {
	if docker != nil {
		removeTestContainers()
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})

// removeTestContainers removes every container a test node left behind.
func removeTestContainers() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := docker.ContainerList(ctx, container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", dockerruntime.LabelManagedBy+"="+dockerruntime.ManagedByValue))})
	if err != nil {
		GinkgoWriter.Printf("listing leftover containers: %v\n", err)
		return
	}
	for _, ct := range list {
		if len(ct.Labels[dockerruntime.LabelNode]) >= len(testNodePrefix) && ct.Labels[dockerruntime.LabelNode][:len(testNodePrefix)] == testNodePrefix {
			_ = docker.ContainerRemove(ctx, ct.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
		}
	}
}

// testManager is one node's manager running in this process.
type testManager struct {
	node       string
	reconciler *SandboxReconciler
	cancel     context.CancelFunc
	done       chan struct{}
}

type managerConfig struct {
	dockerHost       string
	maxSandboxes     int
	orphanGCInterval time.Duration
	history          HistoryDeleter
}

// startManager runs a manager for node (prefixed with testNodePrefix) until
// the test ends or stop is called.
func startManager(node string, mc managerConfig) *testManager {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	Expect(err).NotTo(HaveOccurred())
	rt, err := dockerruntime.New(dockerruntime.Options{Host: mc.dockerHost, CallTimeout: 10 * time.Second, PullTimeout: 20 * time.Second})
	Expect(err).NotTo(HaveOccurred())
	if mc.orphanGCInterval == 0 {
		mc.orphanGCInterval = time.Hour
	}
	r, err := NewSandboxReconciler(mgr.GetClient(), mgr.GetAPIReader(), rt, mgr.GetEventRecorder("sandbox-manager-"+node),
		clock.RealClock{}, Options{
			NodeName:           node,
			MaxSandboxes:       mc.maxSandboxes,
			StopGracePeriod:    time.Second,
			RetryBackoffBase:   200 * time.Millisecond,
			RetryBackoffMax:    2 * time.Second,
			SkipNameValidation: true,
			History:            mc.history,
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

var nameCounter int

func uniqueName(prefix string) string {
	nameCounter++
	return fmt.Sprintf("%s-%d-%d", prefix, GinkgoParallelProcess(), nameCounter)
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

// readyReason returns the Ready condition's status and reason, or "" if the
// Sandbox has none or is gone.
func readyReason(key types.NamespacedName) func() string {
	return func() string {
		sbx := &sandboxv1alpha1.Sandbox{}
		if err := k8sClient.Get(context.Background(), key, sbx); err != nil {
			return "error: " + err.Error()
		}
		c := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
		if c == nil {
			return ""
		}
		return string(c.Status) + "/" + c.Reason
	}
}

func waitReady(sbx *sandboxv1alpha1.Sandbox) *sandboxv1alpha1.Sandbox {
	GinkgoHelper()
	key := client.ObjectKeyFromObject(sbx)
	Eventually(readyReason(key), 90*time.Second, 100*time.Millisecond).Should(Equal("True/Running"))
	return getSandbox(key)
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
