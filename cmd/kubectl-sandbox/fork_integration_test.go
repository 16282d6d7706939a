//go:build linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// This spec runs a node manager (Docker, iptables): Linux only, so that
// the plugin's tests still compile for windows and darwin (make cross-vet).

package main

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	sandboxcontroller "github.com/code-sandbox/code-sandbox-operator/controllers/sandbox"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient/sandboxclienttest"
	"github.com/code-sandbox/code-sandbox-operator/internal/snapshotstore"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

// The plugin's snapshot and fork against a real API server (envtest) and a
// real node manager on real Docker.
var _ = Describe("kubectl sandbox snapshot and fork", Label("integration"), Ordered, func() {
	const node = "kubectl-fork-node"
	var (
		cp         *testenv.ControlPlane
		kubeconfig string
		ns         string
	)
	BeforeAll(func() {
		if testing.Short() {
			Skip("needs Docker and envtest")
		}
		docker := testenv.RequireDocker(testenv.BusyboxImage)
		cp = testenv.StartControlPlane()
		DeferCleanup(func() {
			testenv.RemoveNodeContainers(docker, node)
			cp.Stop()
		})
		mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{Scheme: cp.Scheme, Metrics: metricsserver.Options{BindAddress: "0"},
			HealthProbeBindAddress: "0", Cache: sandboxcontroller.CacheOptions(node)})
		Expect(err).NotTo(HaveOccurred())
		rt, err := dockerruntime.New(dockerruntime.Options{CallTimeout: 10 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		dir, err := snapshotstore.NewDir(filepath.Join(GinkgoT().TempDir(), "snapshots"), 0)
		Expect(err).NotTo(HaveOccurred())
		r, err := sandboxcontroller.NewSandboxReconciler(mgr.GetClient(), mgr.GetAPIReader(), rt, mgr.GetEventRecorder("kubectl-test"), clock.RealClock{},
			sandboxcontroller.Options{NodeName: node, StopGracePeriod: time.Second, SkipNameValidation: true, Snapshots: &snapshotstore.Node{Dir: dir}})
		Expect(err).NotTo(HaveOccurred())
		Expect(r.SetupWithManager(mgr, time.Hour)).To(Succeed())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer GinkgoRecover()
			defer close(done)
			Expect(mgr.Start(ctx)).To(Succeed())
		}()
		DeferCleanup(func() { cancel(); Eventually(done, 30*time.Second).Should(BeClosed()) })

		ns = cp.NewNamespace("kubectl-fork-")
		kubeconfig = filepath.Join(GinkgoT().TempDir(), "kubeconfig")
		Expect(sandboxclienttest.WriteKubeconfigFor(kubeconfig, cp.Config, ns)).To(Succeed())
	})

	runPlugin := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		code := run(ctx, append([]string{"--kubeconfig", kubeconfig}, args...), strings.NewReader(""), &out, &errOut)
		return code, strings.TrimSpace(out.String()), errOut.String()
	}

	It("snapshots a Sandbox and forks it into 3 Sandboxes with its files", func(ctx SpecContext) {
		src := &sandboxv1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "src"},
			Spec: sandboxv1alpha1.SandboxSpec{Image: testenv.BusyboxImage, Env: []sandboxv1alpha1.EnvVar{{Name: "GREETING", Value: "hi"}}}}
		Expect(cp.Client.Create(ctx, src)).To(Succeed())
		src = testenv.WaitReady(cp.Client, src)
		out, err := exec.Command("docker", "exec", src.Status.ContainerID, "sh", "-c", "echo payload > /app/f").CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))

		code, stdout, stderr := runPlugin("snapshot", "src", "--name", "named")
		Expect(code).To(Equal(0), stderr)
		Expect(stdout).To(Equal("named"))

		code, stdout, stderr = runPlugin("fork", "src", "--count", "3")
		Expect(code).To(Equal(0), stderr)
		names := strings.Fields(stdout)
		Expect(names).To(HaveLen(3))
		for _, n := range names {
			Expect(n).To(HavePrefix("src-fork-"))
			child := &sandboxv1alpha1.Sandbox{}
			Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: n}, child)).To(Succeed())
			Expect(child.Spec.SnapshotRef).NotTo(BeNil())
			out, err := exec.Command("docker", "exec", child.Status.ContainerID, "sh", "-c", "cat /app/f; echo $GREETING").CombinedOutput()
			Expect(err).NotTo(HaveOccurred(), string(out))
			Expect(strings.TrimSpace(string(out))).To(Equal("payload\nhi"))
		}
		var list sandboxv1alpha1.SandboxSnapshotList
		Expect(cp.Client.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		Expect(list.Items).To(HaveLen(2), "the named snapshot and the fork's")

		code, _, stderr = runPlugin("snapshot", "missing")
		Expect(code).To(Equal(exitError))
		Expect(stderr).To(ContainSubstring(`reading Sandbox ` + ns + `/missing`))
	})
})
