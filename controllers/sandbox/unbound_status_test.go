/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// Every node's manager may write the pending conditions of an unbound
// Sandbox, so what such a status says must not survive the claim: a
// compromised manager of node A would otherwise plant a victim's container
// for node B to adopt and the attacker to exec into.
var _ = Describe("The status of an unbound Sandbox, written by another node's manager", func() {
	ctx := context.Background()

	It("is dropped by the claim: node B neither adopts the victim's container nor forgets the deadline", func() {
		nodeB := testNodePrefix + "unbound-b"
		victimNS, attackerNS := newNamespace(), newNamespace()

		// The victim's Sandbox runs on node B.
		b := startManager(nodeB, managerConfig{})
		victim := waitReady(createSandbox(newSandbox(victimNS, "victim", nodeB)))
		victimCt := victim.Status.ContainerID
		Expect(victimCt).NotTo(BeEmpty())

		// While node B's manager is away (so that the planted status is in
		// place before its claim), the attacker creates a Sandbox for node
		// B with a short deadline, and a compromised manager of node A (this
		// test, writing the status subresource in its place) plants the
		// victim's container and member UID and a far-future start.
		b.stop()
		attack := createSandbox(newSandbox(attackerNS, "attack", nodeB, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.ActiveDeadlineSeconds = ptr.To[int64](6)
		}))
		key := client.ObjectKeyFromObject(attack)
		future := metav1.NewTime(time.Date(2999, 1, 1, 0, 0, 0, 0, time.UTC))
		Eventually(func() error {
			s := getSandbox(key)
			s.Status.ContainerID = victimCt
			s.Status.StartTime = &future
			s.Status.NodeAPIEndpoint = "https://203.0.113.7:9443"
			s.Status.WarmPool = &sandboxv1alpha1.SandboxWarmPoolClaimStatus{
				Member: &sandboxv1alpha1.WarmPoolMemberReference{Name: victim.Name, UID: victim.UID},
			}
			meta.SetStatusCondition(&s.Status.Conditions, metav1.Condition{Type: string(sandboxv1alpha1.SandboxConditionReady),
				Status: metav1.ConditionFalse, Reason: sandboxv1alpha1.SandboxReasonPending, Message: "planted"})
			return k8sClient.Status().Update(ctx, s)
		}).Should(Succeed())
		Expect(getSandbox(key).ContainerUID()).To(Equal(attack.UID), "status.warmPool.member counts only with spec.warmPoolRef")

		// Node B's manager comes back and claims the attacker's Sandbox.
		startManager(nodeB, managerConfig{})
		got := waitReady(attack)
		Expect(got.Status.NodeName).To(Equal(nodeB))
		Expect(got.Status.ContainerID).NotTo(Equal(victimCt), "node B adopted the victim's container")
		Expect(got.Status.WarmPool).To(BeNil())
		Expect(got.Status.StartTime.Time).To(BeTemporally("~", time.Now(), time.Minute), "the planted start time survived the claim")
		Expect(inspect(got.Status.ContainerID).Config.Labels).To(HaveKeyWithValue("sandbox.code-sandbox.dev/sandbox-namespace", attackerNS))

		// The deadline applies: the attacker's Sandbox expires, and the
		// victim's container is untouched.
		Eventually(func() bool {
			return meta.IsStatusConditionTrue(getSandbox(key).Status.Conditions, string(sandboxv1alpha1.SandboxConditionExpired))
		}, 60*time.Second, 200*time.Millisecond).Should(BeTrue())
		Expect(inspect(victimCt).State.Running).To(BeTrue())
		Expect(getSandbox(client.ObjectKeyFromObject(victim)).Status.ContainerID).To(Equal(victimCt))
	})
})
