/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxquota_test

import (
	"context"
	"fmt"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/quota"
)

var _ = Describe("SandboxQuota spec.hard.snapshots", func() {
	snapshot := func(ns, name string) *sandboxv1alpha1.SandboxSnapshot {
		return &sandboxv1alpha1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: sandboxv1alpha1.SandboxSnapshotSpec{SandboxRef: sandboxv1alpha1.SnapshotSandboxReference{Name: "src"}}}
	}
	used := func(ns, name string) func(Gomega) sandboxv1alpha1.SandboxQuotaUsage {
		return func(g Gomega) sandboxv1alpha1.SandboxQuotaUsage {
			q := &sandboxv1alpha1.SandboxQuota{}
			g.Expect(cp.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, q)).To(Succeed())
			return q.Status.Used
		}
	}
	// stored writes what the holding node's manager writes once a
	// snapshot's files are stored, but status.node: setting it is a claim,
	// which the webhook allows only to the source's node's manager
	// (snapshot_claim_test.go); the count does not read it. The status
	// policy (only that node's manager may write it) is tested in
	// test/manifests; envtest here has no policies, so the admin client
	// stands in for the manager.
	stored := func(s *sandboxv1alpha1.SandboxSnapshot, size int64) {
		GinkgoHelper()
		Eventually(func(g Gomega) {
			g.Expect(cp.Client.Get(context.Background(), client.ObjectKeyFromObject(s), s)).To(Succeed())
			s.Status.SizeBytes = size
			meta.SetStatusCondition(&s.Status.Conditions, metav1.Condition{Type: string(sandboxv1alpha1.SnapshotConditionReady),
				Status: metav1.ConditionTrue, Reason: sandboxv1alpha1.SnapshotReasonStored, Message: "stored"})
			g.Expect(cp.Client.Status().Update(context.Background(), s)).To(Succeed())
		}).Should(Succeed())
	}

	It("refuses a snapshot over the count, in every quota of the namespace, and admits one again after a delete", func() {
		ctx := context.Background()
		ns := newNamespace()
		newQuota(ns, "two", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Snapshots: ptr.To[int64](2)}})
		newQuota(ns, "unrelated", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](5)}})
		first := snapshot(ns, "s1")
		Expect(cp.Client.Create(ctx, first)).To(Succeed())
		Expect(cp.Client.Create(ctx, snapshot(ns, "s2"))).To(Succeed())
		err := cp.Client.Create(ctx, snapshot(ns, "s3"))
		Expect(err).To(beForbidden(`sandbox quota "two" exceeded: snapshots: requested 1, used 2, limit 2 (1 over)`))
		// The quota that limits no snapshot figure still shows them.
		Eventually(used(ns, "unrelated")).Should(HaveField("Snapshots", int64(2)))
		// Another namespace is not charged.
		other := newNamespace()
		Expect(cp.Client.Create(ctx, snapshot(other, "s3"))).To(Succeed())
		// A deleted snapshot frees its place (it has no finalizer: no
		// node took it here) once the controller recounts.
		Expect(cp.Client.Delete(ctx, first)).To(Succeed())
		Eventually(func() error { return cp.Client.Create(ctx, snapshot(ns, "s3")) }).Should(Succeed())
		Expect(cp.Client.List(ctx, &sandboxv1alpha1.SandboxSnapshotList{}, client.InNamespace(ns))).To(Succeed())
	})

	It("refuses every snapshot under a zero count", func() {
		ns := newNamespace()
		newQuota(ns, "none", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Snapshots: ptr.To[int64](0)}})
		Expect(cp.Client.Create(context.Background(), snapshot(ns, "s1"))).To(beForbidden(`snapshots: requested 1, used 0, limit 0 (1 over)`))
	})

	It("reserves: of 8 concurrent creates under a limit of 3, exactly 3 pass", func() {
		ctx := context.Background()
		ns := newNamespace()
		newQuota(ns, "three", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Snapshots: ptr.To[int64](3)}})
		const n = 8
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer GinkgoRecover()
				<-start
				errs[i] = cp.Client.Create(ctx, snapshot(ns, fmt.Sprintf("race-%d", i)))
			}()
		}
		close(start)
		wg.Wait()
		passed := 0
		for _, err := range errs {
			if err == nil {
				passed++
				continue
			}
			Expect(err).To(beForbidden(`sandbox quota "three" exceeded: snapshots: requested 1, used 3, limit 3 (1 over)`))
		}
		Expect(passed).To(Equal(3))
		var list sandboxv1alpha1.SandboxSnapshotList
		Expect(cp.Client.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		Expect(list.Items).To(HaveLen(3))
		// The reservations settle into counted snapshots.
		Eventually(func(g Gomega) {
			q := &sandboxv1alpha1.SandboxQuota{}
			g.Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "three"}, q)).To(Succeed())
			g.Expect(q.Status.Used.Snapshots).To(Equal(int64(3)))
			g.Expect(q.Status.Reservations).To(BeEmpty())
			g.Expect(q.Status.Summary).To(Equal("snapshots: 3/3"))
			g.Expect(meta.FindStatusCondition(q.Status.Conditions, string(sandboxv1alpha1.SandboxQuotaConditionExhausted)).Reason).
				To(Equal(sandboxv1alpha1.SandboxQuotaReasonLimitReached))
		}).Should(Succeed())
	})

	It("shows snapshots and their stored bytes in status.used as they are created, sized and deleted, and refuses a namespace over its bytes", func() {
		ctx := context.Background()
		ns := newNamespace()
		newQuota(ns, "bytes", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{
			Snapshots: ptr.To[int64](10), SnapshotBytes: ptr.To(resource.MustParse("64Ki"))}})
		a, b := snapshot(ns, "a"), snapshot(ns, "b")
		Expect(cp.Client.Create(ctx, a)).To(Succeed())
		Expect(cp.Client.Create(ctx, b)).To(Succeed())
		Eventually(used(ns, "bytes")).Should(And(HaveField("Snapshots", int64(2)), WithTransform(quota.SnapshotBytes, BeZero())))
		stored(a, 40<<10)
		Eventually(used(ns, "bytes")).Should(WithTransform(quota.SnapshotBytes, Equal(int64(40<<10))))
		// Under the cap a new snapshot is admitted (its size is not known).
		c := snapshot(ns, "c")
		Expect(cp.Client.Create(ctx, c)).To(Succeed())
		stored(b, 30<<10)
		Eventually(func(g Gomega) string {
			q := &sandboxv1alpha1.SandboxQuota{}
			g.Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bytes"}, q)).To(Succeed())
			return q.Status.Summary
		}).Should(Equal("snapshots: 3/10, snapshotBytes: 70Ki/64Ki"))
		err := cp.Client.Create(ctx, snapshot(ns, "d"))
		Expect(err).To(beForbidden(`sandbox quota "bytes" exceeded: snapshotBytes: requested a new snapshot, used 70Ki, limit 64Ki (6Ki over)`))
		// A Sandbox is not refused for the snapshots' bytes.
		Expect(cp.Client.Create(ctx, newSandbox(ns))).To(Succeed())
		// Deleting a stored snapshot gives its bytes back.
		Expect(cp.Client.Delete(ctx, a)).To(Succeed())
		Eventually(used(ns, "bytes")).Should(And(HaveField("Snapshots", int64(2)), WithTransform(quota.SnapshotBytes, Equal(int64(30<<10)))))
		Expect(cp.Client.Create(ctx, snapshot(ns, "d"))).To(Succeed())
		// A snapshot that fails for good stops counting.
		Eventually(func(g Gomega) {
			g.Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(c), c)).To(Succeed())
			meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: string(sandboxv1alpha1.SnapshotConditionReady),
				Status: metav1.ConditionFalse, Reason: sandboxv1alpha1.SnapshotReasonTooLarge, Message: "too large"})
			g.Expect(cp.Client.Status().Update(ctx, c)).To(Succeed())
		}).Should(Succeed())
		Eventually(used(ns, "bytes")).Should(HaveField("Snapshots", int64(2)))
	})
})
