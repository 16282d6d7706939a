/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package kubebackend

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// Several MCP server replicas on one real API server (envtest): each a
// Backend of its own, with its own cache, as separate pods would be. No
// manager runs here, so startManager stands in for one: it marks every new
// Sandbox Ready (with a node API address nobody dials; these specs run no
// commands).
var _ = Describe("Backend replicas on one API server", Ordered, func() {
	var (
		ctx         context.Context
		ns          string
		alice, bob  contract.Caller
		replica     func(maxSandboxes int) *Backend
		ownedBy     func(c contract.Caller) []string
		reservation func(c contract.Caller) *coordinationv1.Lease
	)

	BeforeAll(func() {
		ctx = context.Background()
		ns = cp.NewNamespace("mcp-replicas")
		alice, bob = contract.Caller{ID: "alice@example.com"}, contract.Caller{ID: "bob@example.com"}
		startManager(ns)
		replica = func(maxSandboxes int) *Backend {
			GinkgoHelper()
			b, err := New(Options{Config: cp.Config, Namespace: ns, MaxSandboxes: maxSandboxes,
				IdleTimeout: 10 * time.Minute, IdlePause: 90 * time.Second,
				ReadyTimeout: 30 * time.Second, StopTimeout: 10 * time.Second,
				Logger: slog.New(slog.NewTextHandler(GinkgoWriter, nil))})
			Expect(err).NotTo(HaveOccurred())
			rctx, cancel := context.WithCancel(ctx)
			b.Start(rctx)
			DeferCleanup(func() { _ = b.Close(context.Background()); cancel() })
			Eventually(b.Ready).WithArguments(ctx).WithTimeout(30 * time.Second).Should(Succeed())
			return b
		}
		ownedBy = func(c contract.Caller) []string {
			GinkgoHelper()
			var list sandboxv1alpha1.SandboxList
			Expect(cp.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{LabelOwner: contract.IdentityHash(c.ID)})).To(Succeed())
			var names []string
			for i := range list.Items {
				if list.Items[i].DeletionTimestamp == nil {
					names = append(names, list.Items[i].Name)
				}
			}
			return names
		}
		reservation = func(c contract.Caller) *coordinationv1.Lease {
			GinkgoHelper()
			var l coordinationv1.Lease
			Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: reservationName(c)}, &l)).To(Succeed())
			return &l
		}
	})

	It("serves a sandbox made on A from B, keeps it when A stops, and hides it from others", func() {
		a, b := replica(3), replica(3)
		sb, err := a.Create(ctx, alice, contract.CreateRequest{Image: "busybox:1", Lifetime: time.Hour})
		Expect(err).NotTo(HaveOccurred())
		// Its lifetimes are the node manager's to enforce, not a replica's.
		var obj sandboxv1alpha1.Sandbox
		Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: sb.ID}, &obj)).To(Succeed())
		Expect(obj.Spec.Lifecycle).To(HaveValue(Equal(sandboxv1alpha1.SandboxLifecycle{
			IdlePauseSeconds: ptr.To[int64](90), IdleDeleteSeconds: ptr.To[int64](600), ShutdownPolicy: sandboxv1alpha1.ShutdownDelete})))
		Expect(obj.Spec.ActiveDeadlineSeconds).To(HaveValue(BeEquivalentTo(3600)))

		got, err := b.Get(ctx, alice, sb.ID)
		Expect(err).NotTo(HaveOccurred(), "replica B does not know a sandbox replica A made")
		Expect(got.Status).To(Equal("running"))
		// The last use any replica reports is the node manager's record.
		used := metav1.NewTime(time.Now().Add(-time.Minute).Truncate(time.Second))
		obj.Status.LastActivityTime = &used
		Expect(cp.Client.Status().Update(ctx, &obj)).To(Succeed())
		Eventually(func() (time.Time, error) {
			got, err := b.Get(ctx, alice, sb.ID)
			return got.LastUsedAt, err
		}).Should(BeTemporally("==", used.Time))
		Eventually(func() ([]string, error) {
			list, err := b.List(ctx, alice)
			ids := make([]string, 0, len(list))
			for _, s := range list {
				ids = append(ids, s.ID)
			}
			return ids, err
		}).Should(ConsistOf(sb.ID), "replica B's list (from its cache)")

		_, err = b.Get(ctx, bob, sb.ID)
		Expect(err).To(MatchError(contract.ErrNotFound), "another identity saw alice's sandbox")
		Expect(b.Stop(ctx, bob, sb.ID)).To(MatchError(contract.ErrNotFound), "another identity stopped alice's sandbox")
		list, err := b.List(ctx, bob)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(BeEmpty())

		Expect(a.Close(ctx)).To(Succeed())
		Consistently(func() []string { return ownedBy(alice) }).WithTimeout(time.Second).Should(ConsistOf(sb.ID),
			"replica A's stop deleted a sandbox")

		Expect(b.Stop(ctx, alice, sb.ID)).To(Succeed(), "replica B could not stop a sandbox replica A made")
		Expect(ownedBy(alice)).To(BeEmpty())
	})

	It("holds one identity to --max-sandboxes exactly under concurrent creates on two replicas", func() {
		const limit, tries = 3, 24
		a, b := replica(limit), replica(limit)
		var (
			wg             sync.WaitGroup
			mu             sync.Mutex
			made           []string
			quota, failure []error
		)
		start := make(chan struct{})
		for i := range tries {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				r := a
				if i%2 == 1 {
					r = b
				}
				<-start
				sb, err := r.Create(ctx, alice, contract.CreateRequest{Image: "busybox:1"})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					made = append(made, sb.ID)
				case errors.Is(err, contract.ErrQuota):
					quota = append(quota, err)
				default:
					failure = append(failure, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		Expect(failure).To(BeEmpty())
		Expect(made).To(HaveLen(limit), "creates that succeeded")
		Expect(quota).To(HaveLen(tries - limit))
		Expect(quota[0]).To(MatchError(ContainSubstring("the limit is 3")))
		Expect(ownedBy(alice)).To(ConsistOf(made), "alice's Sandboxes in the API server")

		// Another identity has its own count and sees nothing of alice's.
		sb, err := b.Create(ctx, bob, contract.CreateRequest{Image: "busybox:1"})
		Expect(err).NotTo(HaveOccurred(), "bob was counted alice's sandboxes")
		Expect(b.Stop(ctx, bob, sb.ID)).To(Succeed())
		list, err := a.List(ctx, bob)
		Expect(err).NotTo(HaveOccurred())
		Expect(list).To(BeEmpty())

		// A sandbox stopped on A frees its place on B at once.
		Expect(a.Stop(ctx, alice, made[0])).To(Succeed())
		sb, err = b.Create(ctx, alice, contract.CreateRequest{Image: "busybox:1"})
		Expect(err).NotTo(HaveOccurred(), "the place of a stopped sandbox was not freed")
		_, err = a.Create(ctx, alice, contract.CreateRequest{Image: "busybox:1"})
		Expect(err).To(MatchError(contract.ErrQuota))
		for _, id := range append(made[1:], sb.ID) {
			Expect(a.Stop(ctx, alice, id)).To(Succeed())
		}
	})

	It("counts live Sandboxes whatever the reservation record says (trust rule)", func() {
		a := replica(2)
		var ids []string
		for range 2 {
			sb, err := a.Create(ctx, alice, contract.CreateRequest{Image: "busybox:1"})
			Expect(err).NotTo(HaveOccurred())
			ids = append(ids, sb.ID)
		}
		// Someone who may edit Leases empties alice's record, to lower
		// her count ...
		l := reservation(alice)
		l.Annotations[AnnotationReservations] = "{}"
		Expect(cp.Client.Update(ctx, l)).To(Succeed())
		_, err := a.Create(ctx, alice, contract.CreateRequest{Image: "busybox:1"})
		Expect(err).To(MatchError(contract.ErrQuota), "an emptied record lowered the count")
		// ... or mangles it.
		l = reservation(alice)
		l.Annotations[AnnotationReservations] = "not json"
		Expect(cp.Client.Update(ctx, l)).To(Succeed())
		_, err = a.Create(ctx, alice, contract.CreateRequest{Image: "busybox:1"})
		Expect(err).To(MatchError(contract.ErrQuota), "a mangled record lowered the count")

		// Raising bob's count with made-up entries, old, dated in the
		// future, or naming alice's Sandboxes, keeps bob from nothing.
		sb, err := a.Create(ctx, bob, contract.CreateRequest{Image: "busybox:1"})
		Expect(err).NotTo(HaveOccurred())
		l = reservation(bob)
		forged := map[string]time.Time{
			sb.ID:          time.Now().UTC(),
			"mcp-old":      time.Now().Add(-time.Hour).UTC(),
			"mcp-future":   time.Now().Add(24 * time.Hour).UTC(),
			ids[0]:         time.Now().Add(-time.Hour).UTC(),
			ids[1]:         time.Now().Add(-time.Hour).UTC(),
			"mcp-future-2": time.Now().Add(time.Hour).UTC(),
		}
		raw, _ := json.Marshal(forged)
		l.Annotations[AnnotationReservations] = string(raw)
		Expect(cp.Client.Update(ctx, l)).To(Succeed())
		sb2, err := a.Create(ctx, bob, contract.CreateRequest{Image: "busybox:1"})
		Expect(err).NotTo(HaveOccurred(), "forged entries counted against bob")
		for _, id := range []string{sb.ID, sb2.ID} {
			Expect(a.Stop(ctx, bob, id)).To(Succeed())
		}
		for _, id := range ids {
			Expect(a.Stop(ctx, alice, id)).To(Succeed())
		}
	})

	It("refuses a Sandbox that only looks like the caller's (no owner label) and one that lost its managed-by label still counts", func() {
		a := replica(1)
		// A Sandbox someone made without the owner label (the VAP refuses
		// them the label itself): not alice's.
		fake := &sandboxv1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mcp-lookalike",
			Labels: map[string]string{LabelManagedBy: ManagedBy}}, Spec: sandboxv1alpha1.SandboxSpec{Image: "busybox:1"}}
		Expect(cp.Client.Create(ctx, fake)).To(Succeed())
		_, err := a.Get(ctx, alice, "mcp-lookalike")
		Expect(err).To(MatchError(contract.ErrNotFound))

		sb, err := a.Create(ctx, alice, contract.CreateRequest{Image: "busybox:1"})
		Expect(err).NotTo(HaveOccurred())
		var obj sandboxv1alpha1.Sandbox
		Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: sb.ID}, &obj)).To(Succeed())
		delete(obj.Labels, LabelManagedBy)
		Expect(cp.Client.Update(ctx, &obj)).To(Succeed())
		Consistently(func() error {
			_, err := a.Create(ctx, alice, contract.CreateRequest{Image: "busybox:1"})
			return err
		}).WithTimeout(500*time.Millisecond).Should(MatchError(contract.ErrQuota), "removing managed-by hid a sandbox from the count")
		_, err = a.Get(ctx, alice, sb.ID)
		Expect(err).NotTo(HaveOccurred(), "removing managed-by hid a sandbox from its owner")
		Expect(a.Stop(ctx, alice, sb.ID)).To(Succeed())
		Expect(cp.Client.Delete(ctx, fake)).To(Succeed())
	})
})

// startManager marks every Sandbox in ns Ready, as a node's manager would,
// until the suite ends.
func startManager(ns string) {
	ctx, cancel := context.WithCancel(context.Background())
	DeferCleanup(cancel)
	go func() {
		defer GinkgoRecover()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			var list sandboxv1alpha1.SandboxList
			if err := cp.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
				continue
			}
			for i := range list.Items {
				sbx := &list.Items[i]
				if sbx.DeletionTimestamp != nil || meta.IsStatusConditionTrue(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady)) {
					continue
				}
				sbx.Status.NodeName = "node-1"
				sbx.Status.NodeAPIEndpoint = "https://127.0.0.1:1"
				meta.SetStatusCondition(&sbx.Status.Conditions, metav1.Condition{Type: string(sandboxv1alpha1.SandboxConditionReady),
					Status: metav1.ConditionTrue, Reason: "Running", Message: "marked by the test", ObservedGeneration: sbx.Generation})
				if err := cp.Client.Status().Update(ctx, sbx); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
					GinkgoWriter.Printf("marking %s ready: %v\n", sbx.Name, err)
				}
			}
		}
	}()
}
