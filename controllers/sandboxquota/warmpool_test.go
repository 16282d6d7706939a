/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxquota_test

import (
	"context"
	"errors"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// elsewhere is a node no manager runs: the warm pool Sandboxes here are
// pinned to it, so that the test, not a manager, writes their status.
const elsewhere = "no-such-node"

func newPool(ns, name, image string) *sandboxv1alpha1.SandboxWarmPool {
	return &sandboxv1alpha1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: sandboxv1alpha1.SandboxWarmPoolSpec{Template: sandboxv1alpha1.SandboxTemplate{
			Image:     image,
			Resources: sandboxv1alpha1.SandboxResources{CPU: ptrQ("200m"), Memory: ptrQ("16Mi"), Disk: ptrQ("8Mi")},
		}},
	}
}

func newClaimant(ns, pool string) *sandboxv1alpha1.Sandbox {
	return &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "claim-"},
		Spec: sandboxv1alpha1.SandboxSpec{
			WarmPoolRef: &sandboxv1alpha1.WarmPoolReference{Name: pool},
			NodeName:    elsewhere,
		},
	}
}

// writeStatus retries a status write on conflicts.
func writeStatus(sbx *sandboxv1alpha1.Sandbox, mutate func(*sandboxv1alpha1.Sandbox)) {
	GinkgoHelper()
	Eventually(func() error {
		if err := cp.Client.Get(context.Background(), client.ObjectKeyFromObject(sbx), sbx); err != nil {
			return err
		}
		mutate(sbx)
		return cp.Client.Status().Update(context.Background(), sbx)
	}, 10*time.Second, 50*time.Millisecond).Should(Succeed())
}

// idleMember creates a member of pool through admission and makes it idle
// as its manager would: bound, provisioned, paused.
func idleMember(pool *sandboxv1alpha1.SandboxWarmPool) *sandboxv1alpha1.Sandbox {
	GinkgoHelper()
	m := warmpool.Member(pool)
	m.Spec.NodeName = elsewhere
	Expect(create(m)).To(Succeed())
	writeStatus(m, func(s *sandboxv1alpha1.Sandbox) {
		s.Status.NodeName = elsewhere
		s.Status.ContainerID = "container-" + string(s.UID)
		s.Status.Conditions = []metav1.Condition{
			{Type: string(sandboxv1alpha1.SandboxConditionReady), Status: metav1.ConditionFalse,
				Reason: sandboxv1alpha1.SandboxReasonPaused, Message: "idle", LastTransitionTime: metav1.Now()},
			{Type: string(sandboxv1alpha1.SandboxConditionPaused), Status: metav1.ConditionTrue,
				Reason: sandboxv1alpha1.SandboxReasonPaused, Message: "idle", LastTransitionTime: metav1.Now()}}
	})
	return m
}

func hasCause(err error, t metav1.CauseType) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false
	}
	st := status.Status()
	return subresource.HasCause(&st, t)
}

var _ = Describe("SandboxQuota and warm pools", func() {
	ctx := context.Background()

	It("charges claimants with the pool's template, admits one per idle member at a full quota without deleting it, and counts a claim once", func() {
		ns := newNamespace()
		q := newQuota(ns, "two", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](2)}})
		pool := newPool(ns, "pool", testenv.BusyboxImage)
		Expect(cp.Client.Create(ctx, pool)).To(Succeed())
		older := idleMember(pool)
		time.Sleep(1100 * time.Millisecond) // creationTimestamps have one-second resolution
		newer := idleMember(pool)
		settled(q, 2)

		By("a claim at the full quota is admitted, charged with the template on top of the members, and deletes nothing")
		// Admission deletes nothing: the pool controller (not running in
		// this suite) evicts a member once the claimant exists.
		claim := newClaimant(ns, pool.Name)
		Expect(create(claim)).To(Succeed())
		Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(newer), &sandboxv1alpha1.Sandbox{})).To(Succeed())
		Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(older), &sandboxv1alpha1.Sandbox{})).To(Succeed())
		Expect(getQuota(q).Status.Used.Sandboxes).To(Equal(int64(3)))
		// The claimant sets no resources (1 CPU by default): 200m is the template's.
		Expect(settled(q, 3).Status.Used.CPU.String()).To(Equal("600m"))

		By("while the quota is over, even with idle members the next claim is refused")
		Expect(create(newClaimant(ns, pool.Name))).To(beForbidden(`sandbox quota "two" exceeded: sandboxes: requested 1, used 3, limit 2 (2 over)`))
		Expect(cp.Client.Delete(ctx, newer)).To(Succeed())
		writeStatus(older, func(s *sandboxv1alpha1.Sandbox) { s.Status.Conditions = nil })

		By("once a manager records the claim, the member stops counting and the claimant counts by the recorded template")
		recorded := pool.Spec.Template.DeepCopy()
		recorded.Resources.CPU = ptrQ("300m")
		writeStatus(claim, func(s *sandboxv1alpha1.Sandbox) {
			s.Status.NodeName = elsewhere
			s.Status.WarmPool = &sandboxv1alpha1.SandboxWarmPoolClaimStatus{
				Member:       &sandboxv1alpha1.WarmPoolMemberReference{Name: older.Name, UID: older.UID},
				TemplateHash: warmpool.Hash(*recorded),
				Template:     recorded,
			}
		})
		Expect(settled(q, 1).Status.Used.CPU.String()).To(Equal("300m"))

		By("a member's label and controller reference cannot change")
		err := func() error {
			cur := &sandboxv1alpha1.Sandbox{}
			Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(older), cur)).To(Succeed())
			cur.Labels[sandboxv1alpha1.LabelWarmPool] = "another"
			return cp.Client.Update(ctx, cur)
		}()
		Expect(err).To(beForbidden("cannot join a warm pool or move to another one"))
		Expect(hasCause(err, subresource.CauseWarmPoolMembership)).To(BeTrue(), "%v", err)
		err = func() error {
			cur := &sandboxv1alpha1.Sandbox{}
			Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(claim), cur)).To(Succeed())
			cur.Labels = map[string]string{sandboxv1alpha1.LabelWarmPool: pool.Name}
			cur.OwnerReferences = older.OwnerReferences
			return cp.Client.Update(ctx, cur)
		}()
		Expect(err).To(beForbidden("cannot join a warm pool"))
		// Other label changes do not reach the webhook's membership rule.
		Eventually(func() error {
			cur := &sandboxv1alpha1.Sandbox{}
			if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(older), cur); err != nil {
				return err
			}
			cur.Labels["team"] = "blue"
			return cp.Client.Update(ctx, cur)
		}, 10*time.Second, 50*time.Millisecond).Should(Succeed())
	})

	It("refuses a claimant whose pool does not exist, only where a quota applies", func() {
		free := newNamespace()
		Expect(create(newClaimant(free, "missing"))).To(Succeed())

		ns := newNamespace()
		newQuota(ns, "q", sandboxv1alpha1.SandboxQuotaSpec{})
		err := create(newClaimant(ns, "missing"))
		Expect(err).To(beForbidden(`SandboxWarmPool "missing" does not exist in namespace ` + ns))
		Expect(hasCause(err, subresource.CauseWarmPoolNotFound)).To(BeTrue(), "%v", err)
	})

	It("refuses a pool whose template a quota does not allow, on create and on a template change", func() {
		ns := newNamespace()
		newQuota(ns, "images", sandboxv1alpha1.SandboxQuotaSpec{AllowedImages: []string{"code-sandbox-test/*"}})
		err := cp.Client.Create(ctx, newPool(ns, "bad", "python:3.12"))
		Expect(err).To(beForbidden(`sandbox quota "images" does not allow image "python:3.12" (docker.io/library/python:3.12); allowed images: code-sandbox-test/*`))
		Expect(hasCause(err, subresource.CauseQuotaRule)).To(BeTrue(), "%v", err)

		pool := newPool(ns, "good", testenv.BusyboxImage)
		Expect(cp.Client.Create(ctx, pool)).To(Succeed())
		pool.Spec.Template.Image = "python:3.12"
		Expect(cp.Client.Update(ctx, pool)).To(beForbidden(`does not allow image "python:3.12"`))
		Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(pool), pool)).To(Succeed())
		pool.Spec.Replicas = ptr.To[int32](3)
		Expect(cp.Client.Update(ctx, pool)).To(Succeed())
		DeferCleanup(func() { Expect(cp.Client.Delete(ctx, pool)).To(Succeed()) })
	})
})
