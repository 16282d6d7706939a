/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/snapshotstore"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

// dataFiles lists dir but for the journal of registry pushes
// (.pushed-*), which the holder drops when it deletes the ref and the
// sweep drops otherwise (snapshotsweep_test.go).
func dataFiles(dir string) []string {
	GinkgoHelper()
	entries, err := os.ReadDir(dir)
	Expect(err).NotTo(HaveOccurred())
	var out []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".pushed-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// histogramCount is the number of observations of the histogram name
// with the label label=value (0 if it has none yet).
func histogramCount(name, label, value string) uint64 {
	GinkgoHelper()
	families, err := ctrlmetrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

var _ = Describe("SandboxSnapshots in a registry (two managers, real Docker, docker-registry)", Label("integration", "snapshots"), func() {
	var (
		ns             string
		nodeA, nodeB   string
		dirA, dirB     string
		spoolA, spoolB string
		base           string
		reg            *snapshotstore.Registry
	)
	BeforeEach(func() {
		ns = newNamespace()
		nodeA, nodeB = testNodePrefix+"snapreg-a", testNodePrefix+"snapreg-b"
		dirA, dirB = filepath.Join(GinkgoT().TempDir(), "a"), filepath.Join(GinkgoT().TempDir(), "b")
		base = testenv.StartRegistry(GinkgoT()) + "/sandbox-snapshots"
		// Each manager has a store of its own, as on two machines.
		newReg := func() *snapshotstore.Registry {
			r, err := snapshotstore.NewRegistry(base, snapshotstore.RegistryOptions{SpoolDir: GinkgoT().TempDir()})
			Expect(err).NotTo(HaveOccurred())
			return r
		}
		reg = newReg()
		spoolA, spoolB = GinkgoT().TempDir(), GinkgoT().TempDir()
		startManager(nodeA, managerConfig{snapshots: nodeStore(dirA, newReg()), snapshotSpool: spoolA})
		startManager(nodeB, managerConfig{snapshots: nodeStore(dirB, newReg()), snapshotSpool: spoolB})
	})

	It("stores a snapshot taken on node A in the registry, restores it on node B with its files, and removes it from the registry on delete", func() {
		ctx := context.Background()
		snapshots0 := histogramCount("code_sandbox_snapshot_seconds", "storage", StorageRegistry)
		restores0 := histogramCount("code_sandbox_restore_seconds", "storage", StorageRegistry)
		forks0 := histogramCount("code_sandbox_start_seconds", "path", PathFork)

		src := waitReady(createSandbox(newSandbox(ns, "src", nodeA)))
		out, err := sh(src.Status.ContainerID, "echo hello > /app/a.txt && mkdir -p /app/d && echo deep > /app/d/b && chmod 640 /app/a.txt && echo t > /tmp/t.txt && ln -s a.txt /app/l")
		Expect(err).NotTo(HaveOccurred(), out)

		snap := &sandboxv1alpha1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s1"},
			Spec: sandboxv1alpha1.SandboxSnapshotSpec{SandboxRef: sandboxv1alpha1.SnapshotSandboxReference{Name: "src"}}}
		Expect(k8sClient.Create(ctx, snap)).To(Succeed())
		skey := client.ObjectKeyFromObject(snap)
		Eventually(snapshotReason(skey), 60*time.Second, 100*time.Millisecond).Should(Equal("True/Stored"))
		snap = getSnapshot(skey)
		Expect(snap.Status.Node).To(Equal(nodeA))
		ref := snap.Status.Storage
		Expect(ref).To(MatchRegexp(`^`+regexp.QuoteMeta(base+"/sandboxsnapshots/"+ns+"/"+string(snap.UID)+"/")+`[0-9a-f]{8}@sha256:[0-9a-f]{64}$`), "the location is the registry ref by digest, from the namespace, the UID and a take's random part")
		c := meta.FindStatusCondition(snap.Status.Conditions, string(sandboxv1alpha1.SnapshotConditionReady))
		Expect(c.Message).To(ContainSubstring("in the snapshot registry"))
		for _, d := range []string{dirA, dirB} {
			Expect(dataFiles(d)).To(BeEmpty(), "nothing is kept on the node but the journal of the push")
		}
		rc, err := reg.Open(ctx, ref)
		Expect(err).NotTo(HaveOccurred())
		Expect(rc.Close()).To(Succeed())
		Expect(histogramCount("code_sandbox_snapshot_seconds", "storage", StorageRegistry)).To(BeNumerically(">", snapshots0))

		// Pinned to node B, which never ran the source: restored there.
		onB := waitReady(createSandbox(newSandbox(ns, "fork-b", nodeB, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.SnapshotRef = &sandboxv1alpha1.SandboxSnapshotReference{Name: "s1"}
		})))
		Expect(onB.Status.NodeName).To(Equal(nodeB))
		Expect(meta.IsStatusConditionTrue(onB.Status.Conditions, string(sandboxv1alpha1.SandboxConditionSnapshotRestored))).To(BeTrue())
		out, err = sh(onB.Status.ContainerID, "cat /app/a.txt /app/d/b /tmp/t.txt && stat -c %a /app/a.txt && readlink /app/l && ls /app")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(Equal("hello\ndeep\nt\n640\na.txt\na.txt\nd\nl"))
		// An unpinned fork may land on either node, and has the files too.
		anyFork := waitReady(createSandbox(newSandbox(ns, "fork-any", "", func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.SnapshotRef = &sandboxv1alpha1.SandboxSnapshotReference{Name: "s1"}
		})))
		Expect(anyFork.Status.NodeName).To(BeElementOf(nodeA, nodeB))
		out, err = sh(anyFork.Status.ContainerID, "cat /app/a.txt")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(Equal("hello"))
		Expect(histogramCount("code_sandbox_restore_seconds", "storage", StorageRegistry)).To(BeNumerically(">=", restores0+2))
		Expect(histogramCount("code_sandbox_start_seconds", "path", PathFork)).To(BeNumerically(">=", forks0+2))
		// No spooled copy is left behind.
		for _, d := range []string{spoolA, spoolB} {
			Expect(dataFiles(d)).To(BeEmpty())
		}

		// Delete: the manifest goes from the registry, then the object.
		Expect(k8sClient.Delete(ctx, getSnapshot(skey))).To(Succeed())
		Eventually(func() bool {
			err := k8sClient.Get(ctx, skey, &sandboxv1alpha1.SandboxSnapshot{})
			return err != nil && client.IgnoreNotFound(err) == nil
		}, 30*time.Second, 100*time.Millisecond).Should(BeTrue())
		_, err = reg.Open(ctx, ref)
		Expect(err).To(MatchError(snapshotstore.ErrNotFound))
	})
})
