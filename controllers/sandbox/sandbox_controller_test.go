/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/history"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/pkg/stdcopy"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/imagepolicy"
)

// registrySecret is what the fake registry answers with; it must never
// reach a Sandbox's status or Events.
const registrySecret = "SECRET-BODY-123"

// fakeRegistry is a real listener on 127.0.0.1 that records every request.
// It answers the API version check (/v2/) as a registry does and every other
// request with status and a registry-style JSON error quoting
// registrySecret (which the Docker Engine copies into its pull errors for
// 401 and 404).
type fakeRegistry struct {
	Host string
	mu   sync.Mutex
	reqs []string
}

func (f *fakeRegistry) Requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.reqs...)
}

// startManagerWithImagePolicy is startManager (default config) with a
// registry policy on its Docker client.
func startManagerWithImagePolicy(node string, policy *imagepolicy.Policy) *testManager {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	Expect(err).NotTo(HaveOccurred())
	rt, err := dockerruntime.New(dockerruntime.Options{CallTimeout: 10 * time.Second, PullTimeout: 20 * time.Second, ImagePolicy: policy})
	Expect(err).NotTo(HaveOccurred())
	r, err := NewSandboxReconciler(mgr.GetClient(), mgr.GetAPIReader(), rt, mgr.GetEventRecorder("sandbox-manager-"+node),
		clock.RealClock{}, Options{
			NodeName:           node,
			StopGracePeriod:    time.Second,
			RetryBackoffBase:   200 * time.Millisecond,
			RetryBackoffMax:    2 * time.Second,
			SkipNameValidation: true,
		})
	Expect(err).NotTo(HaveOccurred())
	Expect(r.SetupWithManager(mgr, time.Hour)).To(Succeed())
	mctx, cancel := context.WithCancel(context.Background())
	m := &testManager{node: node, reconciler: r, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer GinkgoRecover()
		defer close(m.done)
		defer rt.Close()
		Expect(mgr.Start(mctx)).To(Succeed())
	}()
	DeferCleanup(m.stop)
	return m
}

func startFakeRegistry(status int) *fakeRegistry {
	GinkgoHelper()
	f := &fakeRegistry{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.reqs = append(f.reqs, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		if r.URL.Path == "/v2/" || r.URL.Path == "/v2" {
			w.WriteHeader(http.StatusOK)
			return
		}
		code := map[int]string{http.StatusNotFound: "MANIFEST_UNKNOWN", http.StatusUnauthorized: "UNAUTHORIZED"}[status]
		if code == "" {
			code = "UNKNOWN"
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = fmt.Fprintf(w, `{"errors":[{"code":%q,"message":"%s from the node's network"}]}`, code, registrySecret)
	}))
	DeferCleanup(srv.Close)
	f.Host = strings.TrimPrefix(srv.URL, "http://")
	Expect(f.Host).To(HavePrefix("127.0.0.1:"))
	return f
}

// eventReasons lists the reasons of the Events recorded for a Sandbox.
func eventReasons(sbx *sandboxv1alpha1.Sandbox) func() []string {
	return func() []string {
		var list eventsv1.EventList
		if err := k8sClient.List(context.Background(), &list, client.InNamespace(sbx.Namespace)); err != nil {
			return []string{"error: " + err.Error()}
		}
		var reasons []string
		for _, ev := range list.Items {
			if ev.Regarding.Name == sbx.Name {
				reasons = append(reasons, ev.Reason)
			}
		}
		return reasons
	}
}

func inspect(id string) container.InspectResponse {
	GinkgoHelper()
	resp, err := docker.ContainerInspect(context.Background(), id)
	Expect(err).NotTo(HaveOccurred())
	return resp
}

var _ = Describe("Sandbox controller", func() {
	var ns string
	ctx := context.Background()

	BeforeEach(func() {
		ns = newNamespace()
	})

	It("provisions a hardened container and removes it on delete", func() {
		node := testNodePrefix + "basic"
		startManager(node, managerConfig{})
		sbx := createSandbox(newSandbox(ns, "basic", node))
		key := client.ObjectKeyFromObject(sbx)

		sbx = waitReady(sbx)
		Expect(sbx.Finalizers).To(ContainElement(Finalizer))
		Expect(sbx.Status.NodeName).To(Equal(node))
		Expect(sbx.Status.StartTime).NotTo(BeNil())
		Expect(sbx.Status.ObservedGeneration).To(Equal(sbx.Generation))
		Expect(sbx.Status.ContainerID).NotTo(BeEmpty())
		// Defaults were applied by the API server.
		Expect(sbx.Spec.ImagePullPolicy).To(Equal(sandboxv1alpha1.PullIfNotPresent))
		Expect(sbx.Spec.WorkingDir).To(Equal("/app"))
		Expect(sbx.Spec.User).To(Equal("65534:65534"))
		Expect(sbx.Spec.Runtime).To(Equal(sandboxv1alpha1.RuntimeRunc))
		Expect(sbx.Spec.Network.Mode).To(Equal(sandboxv1alpha1.NetworkNone))

		list := containersOf(sbx.UID)
		Expect(list).To(HaveLen(1))
		ct := inspect(list[0].ID)
		Expect(ct.ID).To(Equal(sbx.Status.ContainerID))
		Expect(ct.Name).To(Equal("/" + dockerruntime.ContainerName(string(sbx.UID))))
		Expect(ct.State.Running).To(BeTrue())

		By("checking every hardening setting on the real container")
		hc := ct.HostConfig
		Expect(hc.Privileged).To(BeFalse())
		Expect(hc.CapDrop).To(ConsistOf("ALL"))
		Expect(hc.CapAdd).To(BeEmpty())
		Expect(hc.SecurityOpt).To(ConsistOf("no-new-privileges:true"))
		Expect(hc.ReadonlyRootfs).To(BeTrue())
		Expect(hc.PidsLimit).To(HaveValue(BeEquivalentTo(256)))
		Expect(hc.Memory).To(BeEquivalentTo(512 << 20))
		Expect(hc.MemorySwap).To(Equal(hc.Memory))
		Expect(hc.NanoCPUs).To(BeEquivalentTo(1_000_000_000))
		Expect(hc.Init).To(HaveValue(BeTrue()))
		Expect(string(hc.NetworkMode)).To(Equal("none"))
		Expect(hc.Binds).To(BeEmpty())
		Expect(hc.Devices).To(BeEmpty())
		Expect(hc.PortBindings).To(BeEmpty())
		Expect(hc.VolumesFrom).To(BeEmpty())
		Expect(string(hc.PidMode)).To(BeEmpty())
		Expect(string(hc.IpcMode)).To(Equal("private"))
		Expect(string(hc.UTSMode)).To(BeEmpty())
		Expect(string(hc.UsernsMode)).To(BeEmpty())
		Expect(hc.MaskedPaths).NotTo(BeEmpty(), "Docker's default masked paths must stay in place")
		Expect(hc.ReadonlyPaths).NotTo(BeEmpty(), "Docker's default read-only paths must stay in place")
		Expect(hc.LogConfig.Type).To(Equal("json-file"))
		Expect(hc.LogConfig.Config).To(HaveKeyWithValue("max-size", dockerruntime.LogMaxSize))
		Expect(string(hc.RestartPolicy.Name)).To(Equal("no"))
		Expect(hc.AutoRemove).To(BeFalse())
		Expect(hc.Runtime).To(Equal("runc"))
		Expect(hc.Tmpfs).To(HaveKeyWithValue("/app", ContainSubstring(fmt.Sprintf("size=%d", 256<<20))))
		Expect(hc.Tmpfs).To(HaveKeyWithValue("/tmp", ContainSubstring("size=")))
		for _, m := range hc.Mounts {
			Expect(m.ReadOnly).To(BeTrue(), "the only mount is the read-only tools volume: %+v", m)
			Expect(m.Source).NotTo(ContainSubstring("docker.sock"))
		}
		Expect(ct.Config.User).To(Equal("65534:65534"))
		Expect(ct.Config.Labels).To(HaveKeyWithValue(dockerruntime.LabelManagedBy, dockerruntime.ManagedByValue))
		Expect(ct.Config.Labels).To(HaveKeyWithValue(dockerruntime.LabelSandboxUID, string(sbx.UID)))
		Expect(ct.Config.Labels).To(HaveKeyWithValue(dockerruntime.LabelNamespace, ns))
		Expect(ct.Config.Labels).To(HaveKeyWithValue(dockerruntime.LabelName, "basic"))
		Expect(ct.Config.Labels).To(HaveKeyWithValue(dockerruntime.LabelNode, node))

		Eventually(eventReasons(sbx), 10*time.Second).Should(ContainElements("Claimed", "Running"))
		Expect(createToReadyCount()).To(BeNumerically(">=", 1), "the create-to-Ready histogram records provisioning")

		By("deleting the Sandbox")
		Expect(k8sClient.Delete(ctx, sbx)).To(Succeed())
		Eventually(isGone(key), 30*time.Second, 100*time.Millisecond).Should(BeTrue())
		Expect(containersOf(sbx.UID)).To(BeEmpty())
	})

	It("runs a Sandbox whose spec the Go client would re-encode (quantities, empty env values)", func() {
		// Written as a user's YAML would be: "0.5" and an env entry with
		// no value. The typed client reads them back as "500m" and without
		// the value, so a full update by the manager looks like a spec
		// change that the CRD's immutability rules refuse; the finalizer
		// goes on with a patch of the finalizers alone.
		node := testNodePrefix + "encoding"
		startManager(node, managerConfig{})
		raw := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": sandboxv1alpha1.GroupVersion.String(),
			"kind":       "Sandbox",
			"metadata":   map[string]any{"namespace": ns, "name": "encoding"},
			"spec": map[string]any{
				"image":     busyboxImage,
				"nodeName":  node,
				"resources": map[string]any{"cpu": "0.5", "memory": "1024Mi"},
				"env":       []any{map[string]any{"name": "EMPTY", "value": ""}, map[string]any{"name": "SET", "value": "x"}},
			},
		}}
		Expect(k8sClient.Create(ctx, raw)).To(Succeed())
		sbx := newSandbox(ns, "encoding", node)
		DeferCleanup(func() { _ = k8sClient.Delete(context.Background(), sbx) })
		sbx = waitReady(sbx)
		Expect(sbx.Finalizers).To(ContainElement(Finalizer))

		Expect(k8sClient.Delete(ctx, sbx)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(sbx), &sandboxv1alpha1.Sandbox{}))
		}, 30*time.Second, 100*time.Millisecond).Should(BeTrue(), "the finalizer must come off the same way")
		Expect(containersOf(sbx.UID)).To(BeEmpty())
	})

	It("keeps an image without a shell or sleep running, with the default command", func() {
		// An image holding one data file: no shell, no sleep, no entrypoint.
		emptyImage := "code-sandbox-test/empty:1"
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		Expect(tw.WriteHeader(&tar.Header{Name: "README", Mode: 0o644, Size: 5})).To(Succeed())
		_, err := tw.Write([]byte("empty"))
		Expect(err).NotTo(HaveOccurred())
		Expect(tw.Close()).To(Succeed())
		rc, err := docker.ImageImport(ctx, image.ImportSource{Source: &buf, SourceName: "-"}, emptyImage, image.ImportOptions{})
		Expect(err).NotTo(HaveOccurred())
		_, _ = io.Copy(io.Discard, rc)
		Expect(rc.Close()).To(Succeed())

		node := testNodePrefix + "idle"
		startManager(node, managerConfig{})
		sbx := createSandbox(newSandbox(ns, "empty", node, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Image = emptyImage
			s.Spec.ImagePullPolicy = sandboxv1alpha1.PullNever
		}))
		sbx = waitReady(sbx)
		Consistently(readyReason(client.ObjectKeyFromObject(sbx)), 2*time.Second).Should(Equal("True/Running"))
		Expect([]string(inspect(sbx.Status.ContainerID).Config.Entrypoint)).To(Equal([]string{dockerruntime.IdleProcessPath}))
		Expect(inspect(sbx.Status.ContainerID).State.Running).To(BeTrue())
	})

	It("fails closed when a second container claims the Sandbox's UID", func() {
		node := testNodePrefix + "dup"
		startManager(node, managerConfig{})
		sbx := waitReady(createSandbox(newSandbox(ns, "dup", node, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Command = []string{"sleep", "3600"}
		})))
		key := client.ObjectKeyFromObject(sbx)

		By("forging a second container with the same ownership labels")
		cfg := inspect(sbx.Status.ContainerID).Config
		forged, err := docker.ContainerCreate(ctx, &container.Config{Image: busyboxImage, Cmd: []string{"sleep", "3600"}, Labels: cfg.Labels}, nil, nil, nil, "forged-"+ns)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() {
			_ = docker.ContainerRemove(context.Background(), forged.ID, container.RemoveOptions{Force: true})
		})
		// A Docker event on the forged container (start) wakes the manager.
		Expect(docker.ContainerStart(ctx, forged.ID, container.StartOptions{})).To(Succeed())

		Eventually(readyReason(key), 30*time.Second, 100*time.Millisecond).Should(Equal("False/MultipleContainers"))
		Expect(meta.FindStatusCondition(getSandbox(key).Status.Conditions, "Ready").Message).To(ContainSubstring("2 containers"))
		Consistently(containerCount(sbx.UID), 2*time.Second).Should(Equal(2), "neither container may be touched")
		Eventually(eventReasons(sbx), 10*time.Second).Should(ContainElement("MultipleContainers"))

		By("an operator removing the forged container resolves it")
		Expect(docker.ContainerRemove(ctx, forged.ID, container.RemoveOptions{Force: true})).To(Succeed())
		Eventually(readyReason(key), 90*time.Second, 200*time.Millisecond).Should(Equal("True/Running"))
		Expect(getSandbox(key).Status.ContainerID).To(Equal(sbx.Status.ContainerID))
	})

	It("reports a container that exits, with its exit code", func() {
		node := testNodePrefix + "exit"
		startManager(node, managerConfig{})
		sbx := createSandbox(newSandbox(ns, "exits", node, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Command = []string{"sh", "-c", "sleep 1; exit 3"}
		}))
		key := client.ObjectKeyFromObject(sbx)
		Eventually(readyReason(key), 60*time.Second, 100*time.Millisecond).Should(Equal("False/ContainerExited"))
		cond := meta.FindStatusCondition(getSandbox(key).Status.Conditions, "Ready")
		Expect(cond.Message).To(ContainSubstring("code 3"))
		Eventually(eventReasons(sbx), 10*time.Second).Should(ContainElement("ContainerExited"))
		// Not restarted in place.
		Consistently(containerCount(sbx.UID), 2*time.Second).Should(Equal(1))
		Expect(inspect(containersOf(sbx.UID)[0].ID).State.Running).To(BeFalse())
	})

	It("reports an OOM kill", func() {
		node := testNodePrefix + "oom"
		startManager(node, managerConfig{})
		sbx := createSandbox(newSandbox(ns, "oom", node, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Image = pythonImage
			s.Spec.Resources.Memory = ptr.To(resource.MustParse("32Mi"))
			s.Spec.Command = []string{"python3", "-c", "import time; time.sleep(1); x = ' ' * (300 * 1024 * 1024); time.sleep(60)"}
		}))
		key := client.ObjectKeyFromObject(sbx)
		Eventually(readyReason(key), 60*time.Second, 100*time.Millisecond).Should(Equal("False/OOMKilled"))
		Expect(meta.FindStatusCondition(getSandbox(key).Status.Conditions, "Ready").Message).To(ContainSubstring("32Mi"))
		Eventually(eventReasons(sbx), 10*time.Second).Should(ContainElement("OOMKilled"))
	})

	It("recreates a container removed behind its back and reports ContainerMissing", func() {
		node := testNodePrefix + "missing"
		startManager(node, managerConfig{})
		sbx := waitReady(createSandbox(newSandbox(ns, "missing", node)))
		oldID := sbx.Status.ContainerID

		Expect(docker.ContainerRemove(ctx, oldID, container.RemoveOptions{Force: true})).To(Succeed())

		Eventually(eventReasons(sbx), 30*time.Second, 100*time.Millisecond).Should(ContainElement("ContainerMissing"))
		Eventually(func() string {
			s := getSandbox(client.ObjectKeyFromObject(sbx))
			if c := meta.FindStatusCondition(s.Status.Conditions, "Ready"); c == nil || c.Reason != "Running" {
				return ""
			}
			return s.Status.ContainerID
		}, 60*time.Second, 100*time.Millisecond).ShouldNot(Or(BeEmpty(), Equal(oldID)))
		Expect(containersOf(sbx.UID)).To(HaveLen(1))
	})

	It("adopts the container of a manager killed between create and status write", func() {
		node := testNodePrefix + "crash"
		sbx := createSandbox(newSandbox(ns, "crash", node, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Command = []string{"sleep", "3600"}
		}))
		key := client.ObjectKeyFromObject(sbx)

		By("replaying what the dead manager got done: claim, finalizer, container create")
		sbx = getSandbox(key)
		sbx.Status.NodeName = node
		Expect(k8sClient.Status().Update(ctx, sbx)).To(Succeed())
		sbx.Finalizers = append(sbx.Finalizers, Finalizer)
		Expect(k8sClient.Update(ctx, sbx)).To(Succeed())
		spec, err := dockerSpecFor(sbx, Options{NodeName: node})
		Expect(err).NotTo(HaveOccurred())
		cfg, hostCfg, err := dockerruntime.BuildContainerConfig(spec)
		Expect(err).NotTo(HaveOccurred())
		created, err := docker.ContainerCreate(ctx, cfg, hostCfg, nil, nil, dockerruntime.ContainerName(string(sbx.UID)))
		Expect(err).NotTo(HaveOccurred())

		By("starting a new manager for the node")
		startManager(node, managerConfig{})
		sbx = waitReady(sbx)
		Expect(sbx.Status.ContainerID).To(Equal(created.ID))
		Consistently(containerCount(sbx.UID), 2*time.Second).Should(Equal(1))
		Expect(inspect(created.ID).State.Running).To(BeTrue())
	})

	It("cleans up a Sandbox deleted while its manager was down", func() {
		node := testNodePrefix + "down"
		m := startManager(node, managerConfig{})
		sbx := waitReady(createSandbox(newSandbox(ns, "deleted-while-down", node)))
		key := client.ObjectKeyFromObject(sbx)
		m.stop()

		Expect(k8sClient.Delete(ctx, sbx)).To(Succeed())
		Consistently(isGone(key), 2*time.Second).Should(BeFalse(), "the finalizer must hold the Sandbox while nobody can remove its container")
		Expect(containersOf(sbx.UID)).To(HaveLen(1))

		startManager(node, managerConfig{})
		Eventually(isGone(key), 60*time.Second, 100*time.Millisecond).Should(BeTrue())
		Expect(containersOf(sbx.UID)).To(BeEmpty())
	})

	// stripAndDelete does what Attack 3 does: it strips the finalizer and
	// deletes the Sandbox, with the resourceVersion it stripped as a
	// precondition so that the manager cannot put the finalizer back in
	// between (the delete would then go through finalize and prove nothing).
	// It returns when the delete has returned, with the object gone.
	stripAndDelete := func(key client.ObjectKey) {
		GinkgoHelper()
		Eventually(func() error {
			sbx := &sandboxv1alpha1.Sandbox{}
			if err := k8sClient.Get(ctx, key, sbx); err != nil {
				return err
			}
			sbx.Finalizers = nil
			if err := k8sClient.Update(ctx, sbx); err != nil {
				return err
			}
			return k8sClient.Delete(ctx, sbx, client.Preconditions{UID: &sbx.UID, ResourceVersion: &sbx.ResourceVersion})
		}, 10*time.Second, 10*time.Millisecond).Should(Succeed())
		Expect(isGone(key)()).To(BeTrue(), "with no finalizer the delete is immediate")
	}
	// ignoresSIGTERM keeps a Sandbox running through a graceful stop.
	ignoresSIGTERM := func(s *sandboxv1alpha1.Sandbox) {
		s.Spec.Command = []string{"sh", "-c", `trap "" TERM; while true; do sleep 1; done`}
	}
	// rawRemoval is the baseline of a removal: how long Docker itself takes,
	// now, to force-remove a container like the Sandbox's (one that ignores
	// SIGTERM), with nothing of the operator in between.
	rawRemoval := func() time.Duration {
		GinkgoHelper()
		ct, err := docker.ContainerCreate(ctx, &container.Config{Image: busyboxImage,
			Cmd: []string{"sh", "-c", `trap "" TERM; while true; do sleep 1; done`}}, nil, nil, nil, "")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = docker.ContainerRemove(context.Background(), ct.ID, container.RemoveOptions{Force: true}) })
		Expect(docker.ContainerStart(ctx, ct.ID, container.StartOptions{})).To(Succeed())
		start := time.Now()
		Expect(docker.ContainerRemove(ctx, ct.ID, container.RemoveOptions{Force: true})).To(Succeed())
		return time.Since(start)
	}
	// removedPromptly asserts that the operator took less than a graceful
	// stop's wait (suiteStopGrace: the container ignores SIGTERM, so a
	// graceful stop would wait it out) on top of what Docker itself takes:
	// it killed the container on the delete event, not by the orphan sweep
	// (an hour away) and not with grace.
	removedPromptly := func(elapsed time.Duration) {
		GinkgoHelper()
		baseline := rawRemoval()
		AddReportEntry("raw docker rm -f baseline", baseline.String())
		Expect(elapsed-baseline).To(BeNumerically("<", suiteStopGrace),
			"removed %v after the delete, %v more than Docker's own force-remove", elapsed, elapsed-baseline)
	}
	// removedWithin polls Docker until the container is gone and returns how
	// long that took from start.
	removedWithin := func(id string, start time.Time) time.Duration {
		GinkgoHelper()
		Eventually(func() error {
			_, err := docker.ContainerInspect(ctx, id)
			return err
		}, 10*time.Second, 10*time.Millisecond).Should(MatchError(cerrdefs.IsNotFound, "IsNotFound"))
		return time.Since(start)
	}

	It("removes the container of a Sandbox whose finalizer was stripped at once on its delete", func() {
		node := testNodePrefix + "stripped"
		hist, err := history.New(GinkgoT().TempDir(), 0)
		Expect(err).NotTo(HaveOccurred())
		// The sweep runs at start-up, before this Sandbox exists, and then
		// not for an hour: it cannot be what removes the container.
		startManager(node, managerConfig{maxSandboxes: 1, orphanGCInterval: time.Hour, history: hist})
		sbx := waitReady(createSandbox(newSandbox(ns, "stripped", node, ignoresSIGTERM)))
		key := client.ObjectKeyFromObject(sbx)
		id := sbx.Status.ContainerID
		Expect(inspect(id).State.Running).To(BeTrue())
		Expect(inspect(id).Config.Labels).To(HaveKeyWithValue(dockerruntime.LabelSandboxUID, string(sbx.UID)))
		Expect(hist.Append(string(sbx.UID), history.Record{ID: "x", Command: []string{"true"}})).To(Succeed())

		By("stripping the finalizer and deleting the Sandbox")
		stripAndDelete(key)
		elapsed := removedWithin(id, time.Now())
		AddReportEntry("container removal after a stripped-finalizer delete", elapsed.String())
		GinkgoWriter.Printf("container %s removed %v after the delete returned\n", dockerruntime.ShortID(id), elapsed)
		removedPromptly(elapsed)
		Expect(containersOf(sbx.UID)).To(BeEmpty())
		// Dropped right after the container is gone, not before.
		Eventually(func() ([]history.Record, error) { return hist.Tail(string(sbx.UID), 0) }, 5*time.Second, 50*time.Millisecond).
			Should(BeEmpty(), "the exec history goes with the container")

		By("freeing the node's only slot for the next Sandbox")
		next := createSandbox(newSandbox(ns, "after-stripped", node))
		Eventually(readyReason(client.ObjectKeyFromObject(next)), 30*time.Second, 100*time.Millisecond).Should(Equal("True/Running"))
	})

	It("keeps the new container of a Sandbox deleted and re-created under the same name", func() {
		node := testNodePrefix + "recreate"
		startManager(node, managerConfig{maxSandboxes: 1, orphanGCInterval: time.Hour})
		old := waitReady(createSandbox(newSandbox(ns, "recreate", node, ignoresSIGTERM)))
		key := client.ObjectKeyFromObject(old)
		oldID := old.Status.ContainerID

		By("stripping the finalizer, deleting, and re-creating at once")
		stripAndDelete(key)
		deleted := time.Now()
		Expect(k8sClient.Create(ctx, newSandbox(ns, "recreate", node, ignoresSIGTERM))).To(Succeed())
		elapsed := removedWithin(oldID, deleted)
		GinkgoWriter.Printf("old container removed %v after the delete returned\n", elapsed)
		removedPromptly(elapsed)

		By("running the new Sandbox, on the slot the old one freed, and leaving its container alone")
		cur := waitReady(getSandbox(key))
		Expect(cur.UID).NotTo(Equal(old.UID))
		Expect(cur.Status.ContainerID).NotTo(Or(BeEmpty(), Equal(oldID)))
		Consistently(func() bool {
			ct, err := docker.ContainerInspect(ctx, cur.Status.ContainerID)
			return err == nil && ct.State.Running
		}, 3*time.Second, 100*time.Millisecond).Should(BeTrue())
		Expect(containersOf(cur.UID)).To(HaveLen(1))
		Expect(containersOf(old.UID)).To(BeEmpty())
		Expect(getSandbox(key).Status.ContainerID).To(Equal(cur.Status.ContainerID))
	})

	It("collects orphaned containers and leaves everything else alone", func() {
		node := testNodePrefix + "gc"
		otherNode := testNodePrefix + "gc-other"
		rt, err := dockerruntime.New(dockerruntime.Options{})
		Expect(err).NotTo(HaveOccurred())
		defer rt.Close()
		startOrphan := func(owner dockerruntime.Owner) string {
			ct, err := rt.CreateAndStart(ctx, dockerruntime.Spec{Owner: owner, Image: busyboxImage, Command: []string{"sleep", "3600"}, StopGracePeriod: time.Second})
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(func() { _ = rt.Remove(context.Background(), ct.ID, 0) })
			return ct.ID
		}

		hist, err := history.New(GinkgoT().TempDir(), 0)
		Expect(err).NotTo(HaveOccurred())
		Expect(hist.Append("ghost-"+ns, history.Record{ID: "x", Command: []string{"true"}})).To(Succeed())

		// The orphans exist before the manager starts (as after a manager
		// restart): a running manager removes a container of a Sandbox
		// that does not exist as soon as Docker reports it, which would
		// race the create and start here.
		ghost := startOrphan(dockerruntime.Owner{UID: "ghost-" + ns, Namespace: ns, Name: "ghost", Node: node})
		// Same namespace/name as the live Sandbox below but another UID: a
		// Sandbox that was deleted and recreated.
		stale := startOrphan(dockerruntime.Owner{UID: "stale-" + ns, Namespace: ns, Name: "live", Node: node})
		elsewhere := startOrphan(dockerruntime.Owner{UID: "elsewhere-" + ns, Namespace: ns, Name: "ghost2", Node: otherNode})
		startManager(node, managerConfig{orphanGCInterval: 500 * time.Millisecond, history: hist})

		By("a live Sandbox whose container must survive")
		live := waitReady(createSandbox(newSandbox(ns, "live", node, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Command = []string{"sleep", "3600"}
		})))
		unlabelled, err := docker.ContainerCreate(ctx, &container.Config{Image: busyboxImage, Cmd: []string{"sleep", "3600"}}, nil, nil, nil, "not-ours-"+ns)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() {
			_ = docker.ContainerRemove(context.Background(), unlabelled.ID, container.RemoveOptions{Force: true})
		})

		exists := func(id string) func() bool {
			return func() bool {
				_, err := docker.ContainerInspect(ctx, id)
				return err == nil
			}
		}
		Eventually(exists(ghost), 30*time.Second, 200*time.Millisecond).Should(BeFalse())
		Eventually(func() ([]history.Record, error) { return hist.Tail("ghost-"+ns, 0) }).Should(BeEmpty(),
			"the orphan's exec history goes with its container")
		Eventually(exists(stale), 30*time.Second, 200*time.Millisecond).Should(BeFalse())
		Consistently(exists(live.Status.ContainerID), 2*time.Second).Should(BeTrue())
		Expect(exists(elsewhere)()).To(BeTrue(), "another node's container is not this manager's to judge")
		Expect(exists(unlabelled.ID)()).To(BeTrue(), "containers without our labels are never touched")
	})

	It("shares a burst of 20 unbound Sandboxes between two managers without duplicates", func() {
		nodeA, nodeB := testNodePrefix+"burst-a", testNodePrefix+"burst-b"
		startManager(nodeA, managerConfig{maxSandboxes: 12})
		startManager(nodeB, managerConfig{maxSandboxes: 12})

		const n = 20
		sandboxes := make([]*sandboxv1alpha1.Sandbox, n)
		var wg sync.WaitGroup
		for i := range n {
			sandboxes[i] = newSandbox(ns, fmt.Sprintf("burst-%02d", i), "", func(s *sandboxv1alpha1.Sandbox) {
				s.Spec.Command = []string{"sleep", "3600"}
			})
			wg.Add(1)
			go func(s *sandboxv1alpha1.Sandbox) {
				defer GinkgoRecover()
				defer wg.Done()
				createSandbox(s)
			}(sandboxes[i])
		}
		wg.Wait()

		perNode := map[string]int{}
		for _, s := range sandboxes {
			s = waitReady(s)
			Expect(s.Status.NodeName).To(BeElementOf(nodeA, nodeB))
			list := containersOf(s.UID)
			Expect(list).To(HaveLen(1), "sandbox %s", s.Name)
			Expect(list[0].Labels[dockerruntime.LabelNode]).To(Equal(s.Status.NodeName))
			perNode[s.Status.NodeName]++
		}
		Expect(perNode[nodeA]).To(BeNumerically("<=", 12))
		Expect(perNode[nodeB]).To(BeNumerically("<=", 12))
		Expect(perNode[nodeA] + perNode[nodeB]).To(Equal(n))
		Consistently(func() int {
			total := 0
			for _, s := range sandboxes {
				total += len(containersOf(s.UID))
			}
			return total
		}, 2*time.Second).Should(Equal(n))

		for _, s := range sandboxes {
			Expect(k8sClient.Delete(ctx, s)).To(Succeed())
		}
		for _, s := range sandboxes {
			Eventually(isGone(client.ObjectKeyFromObject(s)), 60*time.Second, 100*time.Millisecond).Should(BeTrue())
			Expect(containersOf(s.UID)).To(BeEmpty())
		}
	})

	It("holds a pinned Sandbox while its node is at capacity", func() {
		node := testNodePrefix + "full"
		startManager(node, managerConfig{maxSandboxes: 1})
		first := waitReady(createSandbox(newSandbox(ns, "first", node)))
		second := createSandbox(newSandbox(ns, "second", node))
		key := client.ObjectKeyFromObject(second)
		Eventually(readyReason(key), 20*time.Second, 100*time.Millisecond).Should(Equal("False/NodeAtCapacity"))
		Expect(containersOf(getSandbox(key).UID)).To(BeEmpty())

		Expect(k8sClient.Delete(ctx, first)).To(Succeed())
		Eventually(readyReason(key), 60*time.Second, 100*time.Millisecond).Should(Equal("True/Running"))
	})

	It("reports an unbound Sandbox as Pending while the only node is full", func() {
		node := testNodePrefix + "full-unbound"
		startManager(node, managerConfig{maxSandboxes: 1})
		first := waitReady(createSandbox(newSandbox(ns, "first", "")))
		second := createSandbox(newSandbox(ns, "second", ""))
		key := client.ObjectKeyFromObject(second)
		Eventually(readyReason(key), 20*time.Second, 100*time.Millisecond).Should(Equal("False/Pending"))
		Expect(getSandbox(key).Status.NodeName).To(BeEmpty(), "a full node must not claim it")

		Expect(k8sClient.Delete(ctx, first)).To(Succeed())
		Eventually(readyReason(key), 60*time.Second, 100*time.Millisecond).Should(Equal("True/Running"))
		Expect(getSandbox(key).Status.NodeName).To(Equal(node))
	})

	It("expires a Sandbox after activeDeadlineSeconds", func() {
		node := testNodePrefix + "expiry"
		startManager(node, managerConfig{})
		sbx := waitReady(createSandbox(newSandbox(ns, "short-lived", node, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.ActiveDeadlineSeconds = ptr.To[int64](2)
		})))
		key := client.ObjectKeyFromObject(sbx)
		Eventually(readyReason(key), 30*time.Second, 100*time.Millisecond).Should(Equal("False/Expired"))
		sbx = getSandbox(key)
		Expect(meta.IsStatusConditionTrue(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionExpired))).To(BeTrue())
		Expect(containersOf(sbx.UID)).To(BeEmpty())
		Expect(sbx.Status.ContainerID).To(BeEmpty())
		Consistently(containerCount(sbx.UID), 2*time.Second).Should(BeZero(), "an expired sandbox is never provisioned again")

		Expect(k8sClient.Delete(ctx, sbx)).To(Succeed())
		Eventually(isGone(key), 30*time.Second).Should(BeTrue())
	})

	It("reports images that cannot be found", func() {
		node := testNodePrefix + "image"
		startManager(node, managerConfig{})
		never := createSandbox(newSandbox(ns, "never", node, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Image = "code-sandbox-test/absent:1"
			s.Spec.ImagePullPolicy = sandboxv1alpha1.PullNever
		}))
		for _, s := range []*sandboxv1alpha1.Sandbox{never} {
			key := client.ObjectKeyFromObject(s)
			Eventually(readyReason(key), 60*time.Second, 100*time.Millisecond).Should(Equal("False/ImageNotFound"))
			Expect(meta.FindStatusCondition(getSandbox(key).Status.Conditions, "Ready").Message).To(ContainSubstring(s.Spec.Image))
			Expect(containersOf(getSandbox(key).UID)).To(BeEmpty())
		}
	})

	It("refuses an image on a loopback registry by default: no request reaches it, no retry loop", func() {
		reg := startFakeRegistry(http.StatusInternalServerError)
		node := testNodePrefix + "regdeny"
		startManager(node, managerConfig{})
		sbx := createSandbox(newSandbox(ns, "regdeny", node, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Image = reg.Host + "/team/app:1"
			s.Spec.ImagePullPolicy = sandboxv1alpha1.PullAlways
		}))
		key := client.ObjectKeyFromObject(sbx)
		Eventually(readyReason(key), 60*time.Second, 100*time.Millisecond).Should(Equal("False/" + sandboxv1alpha1.SandboxReasonImageRegistryNotAllowed))
		cond := meta.FindStatusCondition(getSandbox(key).Status.Conditions, "Ready")
		Expect(cond.Message).To(ContainSubstring(reg.Host))
		Expect(cond.Message).To(ContainSubstring("loopback"))
		Expect(containersOf(getSandbox(key).UID)).To(BeEmpty())
		// Settled: the condition does not flap and nothing is ever pulled.
		Consistently(readyReason(key), 2*time.Second, 200*time.Millisecond).Should(Equal("False/" + sandboxv1alpha1.SandboxReasonImageRegistryNotAllowed))
		Expect(reg.Requests()).To(BeEmpty(), "the refused registry was contacted")
	})

	DescribeTable("pulls from a listed registry and reports the failure class, never the registry's response",
		func(status int, class string) {
			reg := startFakeRegistry(status)
			node := testNodePrefix + "regallow"
			policy, err := imagepolicy.New([]string{reg.Host}, true)
			Expect(err).NotTo(HaveOccurred())
			startManagerWithImagePolicy(node, policy)
			sbx := createSandbox(newSandbox(ns, "regallow", node, func(s *sandboxv1alpha1.Sandbox) {
				s.Spec.Image = reg.Host + "/team/app:1"
			}))
			key := client.ObjectKeyFromObject(sbx)
			Eventually(readyReason(key), 60*time.Second, 100*time.Millisecond).Should(Equal("False/ImageNotFound"))
			Eventually(reg.Requests, 10*time.Second).ShouldNot(BeEmpty(), "the listed registry was never contacted")
			cond := meta.FindStatusCondition(getSandbox(key).Status.Conditions, "Ready")
			Expect(cond.Message).To(Equal("ImagePullFailed: " + class + " (pulling " + sbx.Spec.Image + ")"))
			Expect(containersOf(getSandbox(key).UID)).To(BeEmpty())
			// Neither the status nor the Events quote the registry.
			raw, err := json.Marshal(getSandbox(key).Status)
			Expect(err).NotTo(HaveOccurred())
			Expect(string(raw)).NotTo(ContainSubstring(registrySecret))
			var events eventsv1.EventList
			Expect(k8sClient.List(ctx, &events, client.InNamespace(ns))).To(Succeed())
			for _, ev := range events.Items {
				Expect(ev.Note).NotTo(ContainSubstring(registrySecret))
			}
		},
		Entry("a missing manifest (the daemon quotes the body)", http.StatusNotFound, "image not found"),
		Entry("a refused login (the daemon quotes the body)", http.StatusUnauthorized, "unauthorized"),
		Entry("a server error", http.StatusInternalServerError, "registry refused"),
	)

	It("reports DockerUnavailable and keeps the finalizer until the container is proven gone", func() {
		node := testNodePrefix + "nodocker"
		down := startManager(node, managerConfig{dockerHost: "unix:///tmp/code-sandbox-no-such-docker.sock"})
		sbx := createSandbox(newSandbox(ns, "nodocker", node))
		key := client.ObjectKeyFromObject(sbx)
		Eventually(readyReason(key), 30*time.Second, 100*time.Millisecond).Should(Equal("False/DockerUnavailable"))
		Expect(getSandbox(key).Finalizers).To(ContainElement(Finalizer))

		Expect(k8sClient.Delete(ctx, sbx)).To(Succeed())
		Consistently(isGone(key), 3*time.Second).Should(BeFalse())

		By("Docker coming back (a manager with a working daemon) finishes the deletion")
		down.stop()
		startManager(node, managerConfig{})
		Eventually(isGone(key), 30*time.Second, 100*time.Millisecond).Should(BeTrue())
	})

	It("survives the Docker Engine going away and coming back: resubscribes, resyncs, finishes deletes", func() {
		node := testNodePrefix + "flaky-docker"
		proxy := newDockerProxy(filepath.Join(GinkgoT().TempDir(), "docker.sock"), "/var/run/docker.sock")
		startManager(node, managerConfig{dockerHost: "unix://" + proxy.path})
		kept := waitReady(createSandbox(newSandbox(ns, "kept", node, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Command = []string{"sleep", "3600"}
		})))
		doomed := waitReady(createSandbox(newSandbox(ns, "doomed", node, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Command = []string{"sleep", "3600"}
		})))

		By("cutting the manager off from Docker, event stream included")
		proxy.stop()
		Expect(k8sClient.Delete(ctx, doomed)).To(Succeed())
		Eventually(readyReason(client.ObjectKeyFromObject(doomed)), 30*time.Second, 100*time.Millisecond).Should(Equal("False/DockerUnavailable"))
		Consistently(isGone(client.ObjectKeyFromObject(doomed)), 2*time.Second).Should(BeFalse(), "the finalizer holds while the container's fate is unknown")

		By("removing a container while the manager cannot see the event")
		Expect(docker.ContainerRemove(ctx, kept.Status.ContainerID, container.RemoveOptions{Force: true})).To(Succeed())

		By("restoring Docker")
		proxy.start()
		Eventually(isGone(client.ObjectKeyFromObject(doomed)), 60*time.Second, 200*time.Millisecond).Should(BeTrue())
		Expect(containersOf(doomed.UID)).To(BeEmpty())
		// Only a resync after reconnecting can notice the missed destroy.
		Eventually(func() string {
			s := getSandbox(client.ObjectKeyFromObject(kept))
			if c := meta.FindStatusCondition(s.Status.Conditions, "Ready"); c == nil || c.Reason != "Running" {
				return ""
			}
			return s.Status.ContainerID
		}, 60*time.Second, 200*time.Millisecond).ShouldNot(Or(BeEmpty(), Equal(kept.Status.ContainerID)))
		Expect(containersOf(kept.UID)).To(HaveLen(1))
	})

	It("runs a Sandbox under gVisor when runsc is available", func() {
		rt, err := dockerruntime.New(dockerruntime.Options{})
		Expect(err).NotTo(HaveOccurred())
		defer rt.Close()
		has, err := rt.HasRuntime(ctx, dockerruntime.RuntimeRunsc)
		Expect(err).NotTo(HaveOccurred())
		if !has {
			Skip("the Docker Engine has no runsc runtime registered (install runsc and add it to daemon.json; hack/ensure-docker.sh does)")
		}
		node := testNodePrefix + "gvisor"
		startManager(node, managerConfig{})
		sbx := waitReady(createSandbox(newSandbox(ns, "gvisor", node, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Runtime = sandboxv1alpha1.RuntimeGVisor
		})))
		Expect(inspect(sbx.Status.ContainerID).HostConfig.Runtime).To(Equal("runsc"))
		var out strings.Builder
		res, err := rt.Exec(ctx, sbx.Status.ContainerID, dockerruntime.ExecOptions{Cmd: []string{"dmesg"}}, &out, &out)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.ExitCode).To(BeZero())
		Expect(out.String()).To(ContainSubstring("gVisor"))
	})
})

// bigList is n strings of size bytes each.
func bigList(n, size int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = strings.Repeat("x", size)
	}
	return out
}

// bigEnv is n variables (one-byte names A, B, ...) of size-byte values.
func bigEnv(n, size int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = map[string]any{"name": string(rune('A' + i)), "value": strings.Repeat("v", size)}
	}
	return out
}

var _ = Describe("Sandbox validation", func() {
	ctx := context.Background()
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	// Specs are sent as unstructured objects so that values the Go types
	// could not even hold (a quantity "lots") reach the API server.
	DescribeTable("rejects a bad spec with a message naming the problem",
		func(spec map[string]any, wantMessage string) {
			obj := map[string]any{
				"apiVersion": sandboxv1alpha1.GroupVersion.String(),
				"kind":       "Sandbox",
				"metadata":   map[string]any{"name": "bad", "namespace": ns},
				"spec":       spec,
			}
			err := k8sClient.Create(ctx, unstructuredFrom(obj))
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(wantMessage))
		},
		Entry("missing image", map[string]any{}, "spec.image"),
		Entry("empty image", map[string]any{"image": ""}, "spec.image"),
		Entry("an image and a warm pool", map[string]any{"image": "x", "warmPoolRef": map[string]any{"name": "p"}}, "spec.image must be empty when spec.warmPoolRef is set"),
		Entry("a warm pool without a name", map[string]any{"warmPoolRef": map[string]any{}}, "spec.warmPoolRef.name"),
		Entry("memory that is not a quantity", map[string]any{"image": "x", "resources": map[string]any{"memory": "lots"}}, "spec.resources.memory"),
		Entry("memory below Docker's minimum", map[string]any{"image": "x", "resources": map[string]any{"memory": "1Mi"}}, "memory must be at least 6Mi"),
		Entry("zero cpu", map[string]any{"image": "x", "resources": map[string]any{"cpu": "0"}}, "cpu must be greater than 0"),
		Entry("negative pids", map[string]any{"image": "x", "resources": map[string]any{"pids": -1}}, "spec.resources.pids"),
		Entry("disk that is not a quantity", map[string]any{"image": "x", "resources": map[string]any{"disk": "-5"}}, "disk must be at least 1Mi"),
		Entry("unknown runtime", map[string]any{"image": "x", "runtime": "docker"}, "spec.runtime"),
		Entry("unknown network mode", map[string]any{"image": "x", "network": map[string]any{"mode": "Host"}}, "spec.network.mode"),
		Entry("unknown pull policy", map[string]any{"image": "x", "imagePullPolicy": "Sometimes"}, "spec.imagePullPolicy"),
		Entry("root user", map[string]any{"image": "x", "user": "0:0"}, "must not be root"),
		Entry("user name instead of uid", map[string]any{"image": "x", "user": "root"}, "spec.user"),
		Entry("relative workingDir", map[string]any{"image": "x", "workingDir": "app"}, "absolute path"),
		Entry("workingDir with ..", map[string]any{"image": "x", "workingDir": "/app/../etc"}, "'..'"),
		Entry("workingDir on /proc", map[string]any{"image": "x", "workingDir": "/proc/self"}, "workingDir must not be"),
		Entry("negative activeDeadlineSeconds", map[string]any{"image": "x", "activeDeadlineSeconds": -5}, "spec.activeDeadlineSeconds"),
		Entry("zero idlePauseSeconds", map[string]any{"image": "x", "lifecycle": map[string]any{"idlePauseSeconds": 0}}, "spec.lifecycle.idlePauseSeconds"),
		Entry("idleDeleteSeconds over 30 days", map[string]any{"image": "x", "lifecycle": map[string]any{"idleDeleteSeconds": 2592001}}, "spec.lifecycle.idleDeleteSeconds"),
		Entry("idle pause not before idle delete", map[string]any{"image": "x", "lifecycle": map[string]any{"idlePauseSeconds": 60, "idleDeleteSeconds": 60}},
			"lifecycle.idlePauseSeconds must be less than lifecycle.idleDeleteSeconds"),
		Entry("unknown shutdown policy", map[string]any{"image": "x", "lifecycle": map[string]any{"shutdownPolicy": "Forget"}}, "spec.lifecycle.shutdownPolicy"),
		Entry("bad env name", map[string]any{"image": "x", "env": []any{map[string]any{"name": "1BAD", "value": "v"}}}, "spec.env[0].name"),
		Entry("bad node name", map[string]any{"image": "x", "nodeName": "Node_1"}, "spec.nodeName"),
		// Every manager caches every Sandbox: one object's size is paid
		// on every node.
		Entry("a command over 64 KiB in all", map[string]any{"image": "x", "command": bigList(17, 4096)}, "command must total at most 65536 bytes"),
		Entry("env over 64 KiB in all", map[string]any{"image": "x", "env": bigEnv(3, 32768)}, "env names and values must total at most 65536 bytes"),
	)

	It("accepts a lifecycle at its bounds and defaults its shutdown policy to Retain", func() {
		sbx := newSandbox(ns, "lifecycle", testNodePrefix+"nowhere", func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Lifecycle = &sandboxv1alpha1.SandboxLifecycle{IdlePauseSeconds: ptr.To[int64](1), IdleDeleteSeconds: ptr.To[int64](2592000)}
		})
		Expect(k8sClient.Create(ctx, sbx)).To(Succeed())
		Expect(getSandbox(client.ObjectKeyFromObject(sbx)).Spec.Lifecycle.ShutdownPolicy).To(Equal(sandboxv1alpha1.DefaultShutdownPolicy))
	})

	It("accepts a command and env of exactly 64 KiB each", func() {
		obj := map[string]any{
			"apiVersion": sandboxv1alpha1.GroupVersion.String(),
			"kind":       "Sandbox",
			"metadata":   map[string]any{"name": "big", "namespace": ns},
			"spec": map[string]any{"image": "x", "nodeName": testNodePrefix + "nowhere",
				"command": bigList(16, 4096), "env": bigEnv(2, 32768-1)},
		}
		Expect(k8sClient.Create(ctx, unstructuredFrom(obj), client.DryRunAll)).To(Succeed())
	})

	It("pauses a Sandbox (no CPU, exec refused) and resumes it with its files and processes", func() {
		node := testNodePrefix + "pause"
		startManager(node, managerConfig{})
		// A busy loop, so that a frozen container's CPU usage standing still
		// means something.
		sbx := waitReady(createSandbox(newSandbox(ns, "pause", node, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Command = []string{"sh", "-c", "echo kept > /app/f; while :; do :; done"}
		})))
		key := client.ObjectKeyFromObject(sbx)
		id := sbx.Status.ContainerID
		pidBefore := inspect(id).State.Pid
		Expect(cpuUsage(id)).To(BeNumerically(">", 0))

		setPaused(key, true)
		Eventually(readyReason(key), 30*time.Second, 100*time.Millisecond).Should(Equal("False/Paused"))
		Expect(meta.IsStatusConditionTrue(getSandbox(key).Status.Conditions, string(sandboxv1alpha1.SandboxConditionPaused))).To(BeTrue())
		Expect(inspect(id).State.Paused).To(BeTrue())
		first := cpuUsage(id)
		time.Sleep(time.Second)
		Expect(cpuUsage(id)).To(Equal(first), "a paused container used CPU")
		_, err := docker.ContainerExecCreate(ctx, id, container.ExecOptions{Cmd: []string{"true"}})
		Expect(err).To(MatchError(ContainSubstring("paused")))
		Eventually(eventReasons(sbx), 10*time.Second).Should(ContainElement("Paused"))

		setPaused(key, false)
		Eventually(readyReason(key), 30*time.Second, 100*time.Millisecond).Should(Equal("True/Running"))
		cond := meta.FindStatusCondition(getSandbox(key).Status.Conditions, string(sandboxv1alpha1.SandboxConditionPaused))
		Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		Expect(cond.Reason).To(Equal(sandboxv1alpha1.SandboxReasonResumed))
		after := inspect(id)
		Expect(after.State.Paused).To(BeFalse())
		Expect(after.State.Pid).To(Equal(pidBefore), "the sandbox's process did not survive the pause")
		Expect(getSandbox(key).Status.ContainerID).To(Equal(id))
		Expect(dockerExecOutput(id, "cat", "/app/f")).To(Equal("kept\n"))
		resumed := cpuUsage(id)
		Eventually(func() uint64 { return cpuUsage(id) }, 5*time.Second, 200*time.Millisecond).Should(BeNumerically(">", resumed))
	})

	It("rejects spec changes that cannot take effect, and accepts a new lifetime", func() {
		sbx := createSandbox(newSandbox(ns, "immutable", testNodePrefix+"nowhere"))
		key := client.ObjectKeyFromObject(sbx)

		for field, mutate := range map[string]func(*sandboxv1alpha1.Sandbox){
			"image is immutable":        func(s *sandboxv1alpha1.Sandbox) { s.Spec.Image = "other:1" },
			"resources are immutable":   func(s *sandboxv1alpha1.Sandbox) { s.Spec.Resources.Memory = ptr.To(resource.MustParse("1Gi")) },
			"runtime is immutable":      func(s *sandboxv1alpha1.Sandbox) { s.Spec.Runtime = sandboxv1alpha1.RuntimeGVisor },
			"network.mode is immutable": func(s *sandboxv1alpha1.Sandbox) { s.Spec.Network.Mode = sandboxv1alpha1.NetworkEgress },
			"command is immutable":      func(s *sandboxv1alpha1.Sandbox) { s.Spec.Command = []string{"sh"} },
			"nodeName is immutable":     func(s *sandboxv1alpha1.Sandbox) { s.Spec.NodeName = testNodePrefix + "elsewhere" },
		} {
			s := getSandbox(key)
			mutate(s)
			err := k8sClient.Update(ctx, s)
			Expect(err).To(HaveOccurred(), field)
			Expect(err.Error()).To(ContainSubstring(field))
		}

		s := getSandbox(key)
		s.Spec.ActiveDeadlineSeconds = ptr.To[int64](600)
		Expect(k8sClient.Update(ctx, s)).To(Succeed())
		// The lifecycle is the user's to change too.
		s = getSandbox(key)
		s.Spec.Lifecycle = &sandboxv1alpha1.SandboxLifecycle{IdleDeleteSeconds: ptr.To[int64](60), ShutdownPolicy: sandboxv1alpha1.ShutdownDelete}
		Expect(k8sClient.Update(ctx, s)).To(Succeed())
	})
})

// setPaused writes spec.paused, retrying on conflicts with the manager's
// finalizer and status writes.
func setPaused(key types.NamespacedName, paused bool) {
	GinkgoHelper()
	Eventually(func() error {
		s := getSandbox(key)
		s.Spec.Paused = paused
		return k8sClient.Update(context.Background(), s)
	}, 10*time.Second, 100*time.Millisecond).Should(Succeed())
}

// cpuUsage is the container's cumulative CPU time in nanoseconds, as its
// cgroup counts it (read through Docker's one-shot stats).
func cpuUsage(id string) uint64 {
	GinkgoHelper()
	resp, err := docker.ContainerStatsOneShot(context.Background(), id)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	var st container.StatsResponse
	Expect(json.NewDecoder(resp.Body).Decode(&st)).To(Succeed())
	return st.CPUStats.CPUUsage.TotalUsage
}

// dockerExecOutput runs a command in the container with plain docker exec
// and returns its standard output.
func dockerExecOutput(id string, cmd ...string) string {
	GinkgoHelper()
	ctx := context.Background()
	created, err := docker.ContainerExecCreate(ctx, id, container.ExecOptions{Cmd: cmd, AttachStdout: true, AttachStderr: true})
	Expect(err).NotTo(HaveOccurred())
	attach, err := docker.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	Expect(err).NotTo(HaveOccurred())
	defer attach.Close()
	var stdout, stderr bytes.Buffer
	_, err = stdcopy.StdCopy(&stdout, &stderr, attach.Reader)
	Expect(err).NotTo(HaveOccurred())
	return stdout.String()
}

// createToReadyCount reads the number of observations of the
// create-to-Ready histogram from the metrics registry.
func createToReadyCount() uint64 {
	GinkgoHelper()
	families, err := ctrlmetrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() == "code_sandbox_create_to_ready_seconds" {
			return f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	Fail("metric code_sandbox_create_to_ready_seconds is not registered")
	return 0
}

func unstructuredFrom(obj map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: obj}
}
