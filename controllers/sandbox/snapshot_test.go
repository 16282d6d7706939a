/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/snapshotstore"
)

// nodeStore is a node's snapshot store: a directory, and reg when given.
func nodeStore(dir string, reg *snapshotstore.Registry) *snapshotstore.Node {
	GinkgoHelper()
	d, err := snapshotstore.NewDir(dir, 0)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(d.Close)
	return &snapshotstore.Node{Dir: d, Registry: reg}
}

// sh runs a shell command in a container as its sandbox user.
func sh(containerID, script string) (string, error) {
	out, err := exec.Command("docker", "exec", containerID, "sh", "-c", script).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func getSnapshot(key client.ObjectKey) *sandboxv1alpha1.SandboxSnapshot {
	GinkgoHelper()
	s := &sandboxv1alpha1.SandboxSnapshot{}
	Expect(k8sClient.Get(context.Background(), key, s)).To(Succeed())
	return s
}

func snapshotReason(key client.ObjectKey) func() string {
	return func() string {
		s := &sandboxv1alpha1.SandboxSnapshot{}
		if err := k8sClient.Get(context.Background(), key, s); err != nil {
			return err.Error()
		}
		c := meta.FindStatusCondition(s.Status.Conditions, string(sandboxv1alpha1.SnapshotConditionReady))
		if c == nil {
			return ""
		}
		return string(c.Status) + "/" + c.Reason
	}
}

var _ = Describe("SandboxSnapshots and restore (two managers, real Docker)", Label("integration", "snapshots"), func() {
	var (
		ns           string
		nodeA, nodeB string
		dirA, dirB   string
	)
	BeforeEach(func() {
		ns = newNamespace()
		nodeA, nodeB = testNodePrefix+"snap-a", testNodePrefix+"snap-b"
		dirA, dirB = filepath.Join(GinkgoT().TempDir(), "a"), filepath.Join(GinkgoT().TempDir(), "b")
		startManager(nodeA, managerConfig{snapshots: nodeStore(dirA, nil)})
		startManager(nodeB, managerConfig{snapshots: nodeStore(dirB, nil)})
	})

	It("snapshots a Sandbox, forks it on the snapshot's node with the files, keeps forks apart, and removes the data on delete", func() {
		ctx := context.Background()
		src := waitReady(createSandbox(newSandbox(ns, "src", nodeA)))
		out, err := sh(src.Status.ContainerID, "echo hello > /app/a.txt && mkdir -p /app/d && echo deep > /app/d/b && chmod 640 /app/a.txt && echo t > /tmp/t.txt")
		Expect(err).NotTo(HaveOccurred(), out)

		snap := &sandboxv1alpha1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s1"},
			Spec: sandboxv1alpha1.SandboxSnapshotSpec{SandboxRef: sandboxv1alpha1.SnapshotSandboxReference{Name: "src"}}}
		Expect(k8sClient.Create(ctx, snap)).To(Succeed())
		skey := client.ObjectKeyFromObject(snap)
		Eventually(snapshotReason(skey), 60*time.Second, 100*time.Millisecond).Should(Equal("True/Stored"))
		snap = getSnapshot(skey)
		Expect(snap.Status.Node).To(Equal(nodeA))
		Expect(snap.Status.SizeBytes).To(BeNumerically(">", 0))
		Expect(snap.Status.ImageID).To(HavePrefix("sha256:"))
		Expect(snap.Status.Source.Image).To(Equal(busyboxImage))
		Expect(snap.Status.Storage).To(MatchRegexp(`^dir:snap-[0-9a-f]{32}\.tar$`))
		Expect(snap.Finalizers).To(ContainElement(sandboxv1alpha1.FinalizerSnapshotData))
		data := filepath.Join(dirA, strings.TrimPrefix(snap.Status.Storage, "dir:"))
		st, err := os.Stat(data)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Mode().Perm()).To(Equal(os.FileMode(0o600)))
		Expect(st.Size()).To(Equal(snap.Status.SizeBytes))
		dst, err := os.Stat(dirA)
		Expect(err).NotTo(HaveOccurred())
		Expect(dst.Mode().Perm()).To(Equal(os.FileMode(0o700)))
		entries, err := os.ReadDir(dirB)
		Expect(err).NotTo(HaveOccurred())
		Expect(entries).To(BeEmpty(), "the other node keeps nothing")

		// The source's later writes are not in the snapshot.
		_, err = sh(src.Status.ContainerID, "echo later > /app/later.txt")
		Expect(err).NotTo(HaveOccurred())

		// Two forks, unpinned: both land on node A, which holds the files.
		var forks []*sandboxv1alpha1.Sandbox
		for _, name := range []string{"fork-1", "fork-2"} {
			f := createSandbox(newSandbox(ns, name, "", func(s *sandboxv1alpha1.Sandbox) {
				s.Spec.SnapshotRef = &sandboxv1alpha1.SandboxSnapshotReference{Name: "s1"}
			}))
			forks = append(forks, f)
		}
		for i, f := range forks {
			forks[i] = waitReady(f)
			Expect(forks[i].Status.NodeName).To(Equal(nodeA))
			Expect(meta.IsStatusConditionTrue(forks[i].Status.Conditions, string(sandboxv1alpha1.SandboxConditionSnapshotRestored))).To(BeTrue())
			out, err := sh(forks[i].Status.ContainerID, "cat /app/a.txt /app/d/b /tmp/t.txt && stat -c %a /app/a.txt && ls /app")
			Expect(err).NotTo(HaveOccurred(), out)
			Expect(out).To(Equal("hello\ndeep\nt\n640\na.txt\nd"))
		}
		_, err = sh(forks[0].Status.ContainerID, "echo mine > /app/own.txt && echo changed > /app/a.txt")
		Expect(err).NotTo(HaveOccurred())
		out, err = sh(forks[1].Status.ContainerID, "cat /app/a.txt; ls /app")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(Equal("hello\na.txt\nd"), "a fork's writes stay out of its sibling")
		out, err = sh(src.Status.ContainerID, "cat /app/a.txt")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(Equal("hello"), "a fork's writes stay out of the source")

		// Delete: the data goes, then the object.
		Expect(k8sClient.Delete(ctx, getSnapshot(skey))).To(Succeed())
		Eventually(func() bool {
			err := k8sClient.Get(ctx, skey, &sandboxv1alpha1.SandboxSnapshot{})
			return err != nil && client.IgnoreNotFound(err) == nil
		}, 30*time.Second, 100*time.Millisecond).Should(BeTrue())
		_, err = os.Stat(data)
		Expect(os.IsNotExist(err)).To(BeTrue(), "the snapshot's data is removed with it")
	})

	It("fails a snapshot over a quota's snapshotBytes and removes its data", func() {
		ctx := context.Background()
		src := waitReady(createSandbox(newSandbox(ns, "src", nodeA)))
		_, err := sh(src.Status.ContainerID, "head -c 65536 /dev/zero > /app/big")
		Expect(err).NotTo(HaveOccurred())
		q := &sandboxv1alpha1.SandboxQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "q"},
			Spec: sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{SnapshotBytes: ptr.To(resource.MustParse("16Ki"))}}}
		Expect(k8sClient.Create(ctx, q)).To(Succeed())
		snap := &sandboxv1alpha1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "big"},
			Spec: sandboxv1alpha1.SandboxSnapshotSpec{SandboxRef: sandboxv1alpha1.SnapshotSandboxReference{Name: "src"}}}
		Expect(k8sClient.Create(ctx, snap)).To(Succeed())
		skey := client.ObjectKeyFromObject(snap)
		Eventually(snapshotReason(skey), 60*time.Second, 100*time.Millisecond).Should(Equal("False/QuotaExceeded"))
		c := meta.FindStatusCondition(getSnapshot(skey).Status.Conditions, string(sandboxv1alpha1.SnapshotConditionReady))
		Expect(c.Message).To(ContainSubstring(`sandbox quota "q": snapshotBytes: 0 of 16384 bytes used`))
		Expect(c.Message).To(ContainSubstring("data was removed"))
		// Eventually: a reconcile that read the snapshot from a cache that
		// had not seen QuotaExceeded yet takes it again, and removes that
		// data when its status write conflicts.
		Eventually(func() ([]os.DirEntry, error) { return os.ReadDir(dirA) }, 20*time.Second, 100*time.Millisecond).
			Should(BeEmpty(), "nothing is kept of a snapshot over the bytes cap")
		// A fork from it waits: it is not Ready.
		f := createSandbox(newSandbox(ns, "f", "", func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.SnapshotRef = &sandboxv1alpha1.SandboxSnapshotReference{Name: "big"}
		}))
		Eventually(readyReason(client.ObjectKeyFromObject(f)), 20*time.Second, 100*time.Millisecond).Should(Equal("False/SnapshotNotReady"))
		// Deleting it needs no data removal; its finalizer goes.
		Expect(k8sClient.Delete(ctx, getSnapshot(skey))).To(Succeed())
		Eventually(func() bool {
			err := k8sClient.Get(ctx, skey, &sandboxv1alpha1.SandboxSnapshot{})
			return err != nil && client.IgnoreNotFound(err) == nil
		}, 30*time.Second, 100*time.Millisecond).Should(BeTrue())
	})

	It("makes a Sandbox whose snapshotRef names a missing snapshot, or another namespace's, wait unbound", func() {
		ctx := context.Background()
		src := waitReady(createSandbox(newSandbox(ns, "src", nodeB)))
		_, err := sh(src.Status.ContainerID, "echo secret > /app/s")
		Expect(err).NotTo(HaveOccurred())
		snap := &sandboxv1alpha1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s1"},
			Spec: sandboxv1alpha1.SandboxSnapshotSpec{SandboxRef: sandboxv1alpha1.SnapshotSandboxReference{Name: "src"}}}
		Expect(k8sClient.Create(ctx, snap)).To(Succeed())
		Eventually(snapshotReason(client.ObjectKeyFromObject(snap)), 60*time.Second, 100*time.Millisecond).Should(Equal("True/Stored"))
		Expect(getSnapshot(client.ObjectKeyFromObject(snap)).Status.Node).To(Equal(nodeB))

		// Another namespace names the same snapshot name: not found there.
		other := newNamespace()
		thief := createSandbox(newSandbox(other, "thief", "", func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.SnapshotRef = &sandboxv1alpha1.SandboxSnapshotReference{Name: "s1"}
		}))
		Eventually(readyReason(client.ObjectKeyFromObject(thief)), 20*time.Second, 100*time.Millisecond).Should(Equal("False/SnapshotNotFound"))
		Consistently(func() string { return getSandbox(client.ObjectKeyFromObject(thief)).Status.NodeName }, 2*time.Second).Should(BeEmpty())

		// Adversarial names are refused by the schema.
		for _, bad := range []string{"../../etc/passwd", "S1", "a/b", ""} {
			b := newSandbox(ns, "bad", "", func(s *sandboxv1alpha1.Sandbox) {
				s.Spec.SnapshotRef = &sandboxv1alpha1.SandboxSnapshotReference{Name: bad}
			})
			Expect(k8sClient.Create(ctx, b)).NotTo(Succeed(), bad)
		}
		// A snapshotRef with a warmPoolRef is refused, and it is immutable.
		both := newSandbox(ns, "both", "", func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Image = ""
			s.Spec.WarmPoolRef = &sandboxv1alpha1.WarmPoolReference{Name: "p"}
			s.Spec.SnapshotRef = &sandboxv1alpha1.SandboxSnapshotReference{Name: "s1"}
		})
		Expect(k8sClient.Create(ctx, both)).To(MatchError(ContainSubstring("exclusive")))

		// A different image than the snapshot's source is refused at restore.
		wrong := createSandbox(newSandbox(ns, "wrong", "", func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Image = pythonImage
			s.Spec.SnapshotRef = &sandboxv1alpha1.SandboxSnapshotReference{Name: "s1"}
		}))
		Eventually(readyReason(client.ObjectKeyFromObject(wrong)), 30*time.Second, 100*time.Millisecond).Should(Equal("False/RestoreFailed"))
		Expect(getSandbox(client.ObjectKeyFromObject(wrong)).Status.NodeName).To(Equal(nodeB))

		// Pinned to the node that does not hold the snapshot: it says so.
		pinned := createSandbox(newSandbox(ns, "pinned", nodeA, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.SnapshotRef = &sandboxv1alpha1.SandboxSnapshotReference{Name: "s1"}
		}))
		Eventually(readyReason(client.ObjectKeyFromObject(pinned)), 20*time.Second, 100*time.Millisecond).Should(Equal("False/RestoreFailed"))
		Expect(getSandbox(client.ObjectKeyFromObject(pinned)).Status.NodeName).To(BeEmpty())

		// A missing snapshot, then created: the waiting Sandbox restores.
		late := createSandbox(newSandbox(ns, "late", "", func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.SnapshotRef = &sandboxv1alpha1.SandboxSnapshotReference{Name: "s2"}
		}))
		Eventually(readyReason(client.ObjectKeyFromObject(late)), 20*time.Second, 100*time.Millisecond).Should(Equal("False/SnapshotNotFound"))
		s2 := &sandboxv1alpha1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s2"},
			Spec: sandboxv1alpha1.SandboxSnapshotSpec{SandboxRef: sandboxv1alpha1.SnapshotSandboxReference{Name: "src"}}}
		Expect(k8sClient.Create(ctx, s2)).To(Succeed())
		got := waitReady(late)
		Expect(got.Status.NodeName).To(Equal(nodeB))
		out, err := sh(got.Status.ContainerID, "cat /app/s")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(Equal("secret"))

		// spec.sandboxRef is immutable.
		s2 = getSnapshot(client.ObjectKeyFromObject(s2))
		s2.Spec.SandboxRef.Name = "other"
		Expect(k8sClient.Update(ctx, s2)).To(MatchError(ContainSubstring("immutable")))
	})
})
