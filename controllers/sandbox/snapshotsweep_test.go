/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/snapshotstore"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

var _ = Describe("The orphaned snapshot data sweep (envtest, real stores)", Label("integration", "snapshots"), func() {
	var (
		ctx   context.Context
		ns    string
		dir   string
		clk   *clocktesting.FakePassiveClock
		now   time.Time
		hour  = time.Hour
		aged  func(name string, age time.Duration)
		files func() []string
	)
	BeforeEach(func() {
		ctx = context.Background()
		ns = newNamespace()
		dir = filepath.Join(GinkgoT().TempDir(), "snaps")
		now = time.Now()
		clk = clocktesting.NewFakePassiveClock(now)
		aged = func(name string, age time.Duration) {
			GinkgoHelper()
			t := now.Add(-age)
			Expect(os.Chtimes(filepath.Join(dir, name), t, t)).To(Succeed())
		}
		files = func() []string {
			GinkgoHelper()
			entries, err := os.ReadDir(dir)
			Expect(err).NotTo(HaveOccurred())
			var out []string
			for _, e := range entries {
				out = append(out, e.Name())
			}
			return out
		}
	})
	// record makes a SandboxSnapshot whose status records ref, as the
	// holding manager writes it.
	record := func(name, ref string) {
		GinkgoHelper()
		snap := &sandboxv1alpha1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: sandboxv1alpha1.SandboxSnapshotSpec{SandboxRef: sandboxv1alpha1.SnapshotSandboxReference{Name: "src"}}}
		Expect(k8sClient.Create(ctx, snap)).To(Succeed())
		snap.Status.Node = "n"
		snap.Status.Storage = ref
		Expect(k8sClient.Status().Update(ctx, snap)).To(Succeed())
	}
	put := func(store snapshotstore.Store, body string) string {
		GinkgoHelper()
		ref, _, err := store.Put(ctx, "sandboxsnapshots/"+ns+"/x", strings.NewReader(body))
		Expect(err).NotTo(HaveOccurred())
		return ref
	}
	name := func(ref string) string { return strings.TrimPrefix(ref, "dir:") }

	It("removes the node's files no SandboxSnapshot records once past the grace age, at most Max at a time, and leaves the rest", func() {
		store := nodeStore(dir, nil)
		orphan, kept, fresh := put(store, "orphan"), put(store, "kept"), put(store, "fresh")
		record("kept", kept)
		aged(name(orphan), hour)
		aged(name(kept), hour)
		// A Put whose process died part way, and one still streaming.
		oldPart, newPart := ".snap-"+strings.Repeat("a", 32)+".tar.part", ".snap-"+strings.Repeat("b", 32)+".tar.part"
		for _, p := range []string{oldPart, newPart} {
			Expect(os.WriteFile(filepath.Join(dir, p), []byte("x"), 0o600)).To(Succeed())
		}
		aged(oldPart, hour)
		// Names the store never makes are not its to remove.
		Expect(os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o600)).To(Succeed())
		aged("notes.txt", hour)

		sweep := NewSnapshotSweeper(k8sClient, store, clk, "n")
		Expect(sweep).NotTo(BeNil())
		Expect(sweep.Grace).To(Equal(DefaultSnapshotSweepGrace))
		removed, err := sweep.Sweep(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(removed).To(Equal(2))
		Expect(files()).To(ConsistOf(name(kept), name(fresh), newPart, "notes.txt"), "an in-flight take's data is younger than the grace age")
		rc, err := store.Open(ctx, kept)
		Expect(err).NotTo(HaveOccurred())
		rc.Close()

		// Past the grace age the fresh one goes too; and a sweep is bounded.
		more := []string{put(store, "1"), put(store, "2"), put(store, "3")}
		for _, r := range more {
			aged(name(r), hour)
		}
		clk.SetTime(now.Add(DefaultSnapshotSweepGrace + time.Minute))
		sweep.Max = 2
		removed, err = sweep.Sweep(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(removed).To(Equal(2))
		removed, err = sweep.Sweep(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(removed).To(Equal(2))
		removed, err = sweep.Sweep(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(removed).To(Equal(1), "five in all: three new, the fresh one and the partial file now past the grace age")
		Expect(files()).To(ConsistOf(name(kept), "notes.txt"))
		removed, err = sweep.Sweep(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(removed).To(BeZero())
	})

	It("removes the registry manifests this node pushed that no SandboxSnapshot records, found through its journal", func() {
		reg, err := snapshotstore.NewRegistry(testenv.StartRegistry(GinkgoT())+"/sandbox-snapshots", snapshotstore.RegistryOptions{SpoolDir: GinkgoT().TempDir()})
		Expect(err).NotTo(HaveOccurred())
		store := nodeStore(dir, reg)
		orphan, kept := put(store, "orphan"), put(store, "kept")
		record("kept", kept)
		Expect(files()).To(HaveLen(2), "a journal entry for each push, nothing else")
		for _, f := range files() {
			aged(f, hour)
		}
		// A journal entry whose content is not the ref it is named for
		// is not trusted as one.
		forged := ".pushed-" + strings.Repeat("0", 64)
		Expect(os.WriteFile(filepath.Join(dir, forged), []byte(kept), 0o600)).To(Succeed())
		aged(forged, hour)

		removed, err := NewSnapshotSweeper(k8sClient, store, clk, "n").Sweep(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(removed).To(Equal(1))
		_, err = reg.Open(ctx, orphan)
		Expect(err).To(MatchError(snapshotstore.ErrNotFound))
		rc, err := reg.Open(ctx, kept)
		Expect(err).NotTo(HaveOccurred(), "the recorded manifest stays")
		rc.Close()
		Expect(files()).To(HaveLen(2), "the recorded push's journal entry and the forged file")
		// The holder's delete drops the journal entry with the manifest.
		Expect(store.Delete(ctx, kept)).To(Succeed())
		Expect(files()).To(ConsistOf(forged))
	})
})
