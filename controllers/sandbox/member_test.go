/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

var _ = Describe("The warm pool role of a Sandbox, decided once per reconcile", Label("unit"), func() {
	claimantKey := types.NamespacedName{Namespace: unitKey.Namespace, Name: "claimant"}
	// claimantOn is a Sandbox bound to node whose status names the Sandbox
	// under test as the member whose container it took over.
	claimantOn := func(node string) *sandboxv1alpha1.Sandbox {
		return &sandboxv1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: claimantKey.Namespace, Name: claimantKey.Name, UID: "claimant-uid"},
			Spec:       sandboxv1alpha1.SandboxSpec{WarmPoolRef: &sandboxv1alpha1.WarmPoolReference{Name: "pool"}},
			Status: sandboxv1alpha1.SandboxStatus{
				NodeName: node,
				WarmPool: &sandboxv1alpha1.SandboxWarmPoolClaimStatus{
					Member: &sandboxv1alpha1.WarmPoolMemberReference{Name: unitKey.Name, UID: unitUID},
				},
			},
		}
	}
	roleOf := func(objs ...*sandboxv1alpha1.Sandbox) poolRole {
		GinkgoHelper()
		e := newUnitEnv()
		for _, o := range objs {
			status := o.Status
			Expect(e.c.Create(context.Background(), o)).To(Succeed())
			o.Status = status
			Expect(e.c.Status().Update(context.Background(), o)).To(Succeed())
		}
		role, err := e.r.poolRoleOf(context.Background(), e.get())
		Expect(err).NotTo(HaveOccurred())
		return role
	}

	It("is plain for a Sandbox with no pool's marks, no warmPoolRef and no claimant", func() {
		Expect(roleOf(unitSandbox(true))).To(Equal(poolRole{kind: plainSandbox}))
	})

	It("is a pool member for a Sandbox with its pool's label and controller reference", func() {
		Expect(roleOf(unitSandbox(true, asPoolMember))).To(Equal(poolRole{kind: poolMember}))
	})

	It("is plain for a Sandbox with the label alone: the marks need each other", func() {
		Expect(roleOf(unitSandbox(true, func(s *sandboxv1alpha1.Sandbox) {
			s.Labels = map[string]string{sandboxv1alpha1.LabelWarmPool: "pool"}
		}))).To(Equal(poolRole{kind: plainSandbox}))
	})

	It("is a claimant for a Sandbox with spec.warmPoolRef", func() {
		Expect(roleOf(unitSandbox(true, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Image = ""
			s.Spec.WarmPoolRef = &sandboxv1alpha1.WarmPoolReference{Name: "pool"}
		}))).To(Equal(poolRole{kind: poolClaimant}))
	})

	It("is a claimed member, naming its claimant, when a claimant on this node took its container", func() {
		Expect(roleOf(unitSandbox(true, asPoolMember), claimantOn(unitNode))).
			To(Equal(poolRole{kind: claimedMember, claimant: claimantKey, claimantKnown: true}))
	})

	It("stays a claimed member after its pool's marks were removed: the container is the claimant's", func() {
		Expect(roleOf(unitSandbox(true), claimantOn(unitNode))).
			To(Equal(poolRole{kind: claimedMember, claimant: claimantKey, claimantKnown: true}))
	})

	It("ignores a claim written by a Sandbox bound to another node", func() {
		Expect(roleOf(unitSandbox(true, asPoolMember), claimantOn("node-b"))).To(Equal(poolRole{kind: poolMember}))
	})

	It("is a claimed member, claimant unknown, when only its own status records the claim", func() {
		Expect(roleOf(unitSandbox(true, asPoolMember, withReady(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonClaimed)))).
			To(Equal(poolRole{kind: claimedMember}))
	})

	It("is a member being claimed while this manager holds a reservation not yet committed", func() {
		e := newUnitEnv(unitSandbox(true, asPoolMember))
		e.r.members.reserve(unitUID, claimantKey)
		role, err := e.r.poolRoleOf(context.Background(), e.get())
		Expect(err).NotTo(HaveOccurred())
		Expect(role).To(Equal(poolRole{kind: memberBeingClaimed}))
	})
})
