/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxnode_test

import (
	"context"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	dockerclient "github.com/docker/docker/client"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	sandboxcontroller "github.com/code-sandbox/code-sandbox-operator/controllers/sandbox"
	"github.com/code-sandbox/code-sandbox-operator/controllers/sandboxnode"
	"github.com/code-sandbox/code-sandbox-operator/controllers/sandboxquota"
	"github.com/code-sandbox/code-sandbox-operator/controllers/sandboxwarmpool"
	"github.com/code-sandbox/code-sandbox-operator/internal/nodelease"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/tier"
)

const (
	// The nodes' names share a prefix, so that leftovers are found.
	nodeA = "nodeloss-a"
	nodeB = "nodeloss-b"
	// managerNamespace holds the node managers' Leases.
	managerNamespace = "code-sandbox-system"
)

var (
	cp           *testenv.ControlPlane
	docker       *dockerclient.Client
	controlPlane *controlPlaneProcess
	ctx          = context.Background()
)

func TestSandboxNode(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Node loss suite (envtest + real Docker, two node managers)", tier.Config()...) // -short: only specs labelled unit
}

var _ = BeforeSuite(func() {
	if !tier.NeedsIntegration() {
		return
	}
	docker = testenv.RequireDocker(testenv.BusyboxImage)
	cp = testenv.StartControlPlane()
	testenv.RemoveNodeContainers(docker, "nodeloss-")
	for _, ns := range []string{managerNamespace, sandboxnode.KubeletLeaseNamespace} {
		// kube-apiserver creates kube-node-lease itself.
		if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); !apierrors.IsAlreadyExists(err) {
			Expect(err).NotTo(HaveOccurred())
		}
	}
	controlPlane = startControlPlane()
})

var _ = AfterSuite(func() {
	if !tier.NeedsIntegration() {
		return
	}
	controlPlane.stop()
	if docker != nil {
		testenv.RemoveNodeContainers(docker, "nodeloss-")
	}
	cp.Stop()
})

// controlPlaneProcess is the control-plane role's controllers as
// cmd/manager wires them: node loss, quota and warm pools.
type controlPlaneProcess struct {
	stopFn context.CancelFunc
	done   chan struct{}
}

func startControlPlane() *controlPlaneProcess {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{
		Scheme:                 cp.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		Cache:                  sandboxcontroller.CacheOptions(""),
	})
	Expect(err).NotTo(HaveOccurred())
	r, err := sandboxnode.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), mgr.GetEventRecorder("sandboxnode-controller"),
		clock.RealClock{}, sandboxnode.Options{ManagerNamespace: managerNamespace})
	Expect(err).NotTo(HaveOccurred())
	Expect(r.SetupWithManager(mgr)).To(Succeed())
	Expect(sandboxquota.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), clock.RealClock{},
		sandboxquota.Options{}).SetupWithManager(mgr)).To(Succeed())
	Expect(sandboxwarmpool.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), mgr.GetEventRecorder("sandboxwarmpool-controller"),
		clock.RealClock{}, sandboxwarmpool.Options{}).SetupWithManager(mgr)).To(Succeed())

	c, cancel := context.WithCancel(context.Background())
	p := &controlPlaneProcess{stopFn: cancel, done: make(chan struct{})}
	go func() {
		defer GinkgoRecover()
		defer close(p.done)
		Expect(mgr.Start(c)).To(Succeed())
	}()
	return p
}

func (p *controlPlaneProcess) stop() {
	GinkgoHelper()
	if p == nil {
		return
	}
	p.stopFn()
	Eventually(p.done, 30*time.Second).Should(BeClosed())
}

// leaseDuration is the test's kubelet and manager Lease duration; renewer
// renews every renewInterval, as a kubelet renews every 10 s for 40 s.
const (
	leaseDuration = 2 * time.Second
	renewInterval = 500 * time.Millisecond
)

// renewer keeps the Leases of the nodes it is told are up.
type renewer struct {
	mu      sync.Mutex
	kubelet map[string]bool
	manager map[string]bool
	stop    chan struct{}
	done    chan struct{}
}

func startRenewer() *renewer {
	r := &renewer{kubelet: map[string]bool{}, manager: map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer GinkgoRecover()
		defer close(r.done)
		t := time.NewTicker(renewInterval)
		defer t.Stop()
		for {
			r.mu.Lock()
			for n, up := range r.kubelet {
				if up {
					renewKubelet(n, leaseDuration)
				}
			}
			for n, up := range r.manager {
				if up {
					renewManager(n, leaseDuration)
				}
			}
			r.mu.Unlock()
			select {
			case <-r.stop:
				return
			case <-t.C:
			}
		}
	}()
	return r
}

// set says which of node's Leases are renewed from now on; it returns
// once a renewal in flight is done.
func (r *renewer) set(node string, kubelet, manager bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kubelet[node], r.manager[node] = kubelet, manager
}

func (r *renewer) close() {
	close(r.stop)
	<-r.done
}

// kubeletExpiry is when node's kubelet Lease expires, as stored.
func kubeletExpiry(node string) time.Time {
	GinkgoHelper()
	l := &coordinationv1.Lease{}
	Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: sandboxnode.KubeletLeaseNamespace, Name: node}, l)).To(Succeed())
	return l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
}

// renewKubelet writes node's kubelet Lease as its kubelet would: renewed
// now, for duration.
func renewKubelet(node string, duration time.Duration) time.Time {
	GinkgoHelper()
	return putLease(sandboxnode.KubeletLeaseNamespace, node, node, duration, nil)
}

// renewManager writes node's manager Lease as internal/nodelease does.
func renewManager(node string, duration time.Duration) time.Time {
	GinkgoHelper()
	name, err := nodelease.Name(node)
	Expect(err).NotTo(HaveOccurred())
	return putLease(managerNamespace, name, node, duration, map[string]string{nodelease.LabelNodeManager: "true"})
}

// deleteManagerLease is what a manager does at a clean stop.
func deleteManagerLease(node string) {
	GinkgoHelper()
	name, err := nodelease.Name(node)
	Expect(err).NotTo(HaveOccurred())
	Expect(client.IgnoreNotFound(cp.Client.Delete(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: managerNamespace, Name: name}}))).To(Succeed())
}

func putLease(ns, name, holder string, duration time.Duration, labels map[string]string) time.Time {
	GinkgoHelper()
	now := time.Now()
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	err := cp.Client.Get(ctx, client.ObjectKeyFromObject(l), l)
	if err != nil && !apierrors.IsNotFound(err) {
		Expect(err).NotTo(HaveOccurred())
	}
	l.Labels = labels
	l.Spec = coordinationv1.LeaseSpec{
		HolderIdentity:       ptr.To(holder),
		LeaseDurationSeconds: ptr.To(int32(duration / time.Second)),
		RenewTime:            &metav1.MicroTime{Time: now},
	}
	if apierrors.IsNotFound(err) {
		Expect(cp.Client.Create(ctx, l)).To(Succeed())
	} else {
		Expect(cp.Client.Update(ctx, l)).To(Succeed())
	}
	return now.Add(duration)
}
