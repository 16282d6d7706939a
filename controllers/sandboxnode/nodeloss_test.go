/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxnode_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/testnode"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

func small() sandboxv1alpha1.SandboxResources {
	return sandboxv1alpha1.SandboxResources{
		CPU:    ptr.To(resource.MustParse("100m")),
		Memory: ptr.To(resource.MustParse("16Mi")),
		Disk:   ptr.To(resource.MustParse("8Mi")),
	}
}

func pinned(ns, name, node string) *sandboxv1alpha1.Sandbox {
	return &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       sandboxv1alpha1.SandboxSpec{Image: testenv.BusyboxImage, Resources: small(), NodeName: node},
	}
}

func get(key client.ObjectKey) *sandboxv1alpha1.Sandbox {
	GinkgoHelper()
	sbx := &sandboxv1alpha1.Sandbox{}
	Expect(cp.Client.Get(ctx, key, sbx)).To(Succeed())
	return sbx
}

// containersOf lists the containers Docker holds for a Sandbox UID.
func containersOf(uid types.UID) func() []string {
	return func() []string {
		list, err := docker.ContainerList(ctx, container.ListOptions{All: true,
			Filters: filters.NewArgs(filters.Arg("label", dockerruntime.LabelSandboxUID+"="+string(uid)))})
		Expect(err).NotTo(HaveOccurred())
		var ids []string
		for _, ct := range list {
			ids = append(ids, ct.ID)
		}
		return ids
	}
}

func gone(key client.ObjectKey) func() bool {
	return func() bool {
		return apierrors.IsNotFound(cp.Client.Get(ctx, key, &sandboxv1alpha1.Sandbox{}))
	}
}

// members are the pool's members that are not being deleted, by node.
func members(ns, pool string) func() map[string]int {
	return func() map[string]int {
		var list sandboxv1alpha1.SandboxList
		Expect(cp.Client.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		out := map[string]int{}
		for i := range list.Items {
			m := &list.Items[i]
			if warmpool.PoolOf(m) == pool && m.DeletionTimestamp.IsZero() && warmpool.Idle(m) {
				out[m.Status.NodeName]++
			}
		}
		return out
	}
}

func quotaUsed(key client.ObjectKey) func() int64 {
	return func() int64 {
		q := &sandboxv1alpha1.SandboxQuota{}
		Expect(cp.Client.Get(ctx, key, q)).To(Succeed())
		return q.Status.Used.Sandboxes
	}
}

var _ = Describe("Node loss", Ordered, func() {
	var (
		managerA, managerB *testnode.Node
		leases             *renewer
		ns, poolNS         string
		lost, deleted      client.ObjectKey
		lostUID, delUID    types.UID
		memberA            *sandboxv1alpha1.Sandbox
		quotaKey           client.ObjectKey
	)
	running := "True/Running"

	BeforeAll(func() {
		leases = startRenewer()
		DeferCleanup(leases.close)
		for _, n := range []string{nodeA, nodeB} {
			cp.EnsureNode(n)
			leases.set(n, true, true)
		}
		ns, poolNS = cp.NewNamespace("nodeloss-"), cp.NewNamespace("nodeloss-pool-")
		// Only node A runs a manager at first, so that the pool's member
		// lands there.
		managerA = testnode.Start(cp, nil, testnode.NodeOptions{Name: nodeA})
		DeferCleanup(func() { managerA.Stop(); managerB.Stop() })

		quotaKey = client.ObjectKey{Namespace: ns, Name: "q"}
		Expect(cp.Client.Create(ctx, &sandboxv1alpha1.SandboxQuota{
			ObjectMeta: metav1.ObjectMeta{Namespace: quotaKey.Namespace, Name: quotaKey.Name},
			Spec:       sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](10)}},
		})).To(Succeed())
		s1, s2 := pinned(ns, "lost", nodeA), pinned(ns, "deleted-while-lost", nodeA)
		Expect(cp.Client.Create(ctx, s1)).To(Succeed())
		Expect(cp.Client.Create(ctx, s2)).To(Succeed())
		lost, deleted = client.ObjectKeyFromObject(s1), client.ObjectKeyFromObject(s2)
		lostUID = testenv.WaitReady(cp.Client, s1).UID
		delUID = testenv.WaitReady(cp.Client, s2).UID
		Eventually(quotaUsed(quotaKey), 20*time.Second).Should(BeEquivalentTo(2))

		Expect(cp.Client.Create(ctx, &sandboxv1alpha1.SandboxWarmPool{
			ObjectMeta: metav1.ObjectMeta{Namespace: poolNS, Name: "pool"},
			Spec: sandboxv1alpha1.SandboxWarmPoolSpec{Replicas: ptr.To[int32](1),
				Template: sandboxv1alpha1.SandboxTemplate{Image: testenv.BusyboxImage, Resources: small()}},
		})).To(Succeed())
		Eventually(members(poolNS, "pool"), testenv.ReadyTimeout).Should(Equal(map[string]int{nodeA: 1}))
		var list sandboxv1alpha1.SandboxList
		Expect(cp.Client.List(ctx, &list, client.InNamespace(poolNS))).To(Succeed())
		Expect(list.Items).To(HaveLen(1))
		memberA = list.Items[0].DeepCopy()

		managerB = testnode.Start(cp, nil, testnode.NodeOptions{Name: nodeB})
	})

	It("marks nothing while only one of a node's Leases lapses (a manager rollout, a crashlooping manager, a stuck kubelet)", func() {
		By("a rollout: the manager's Lease deleted at a clean stop, the kubelet renewing")
		leases.set(nodeA, true, false)
		deleteManagerLease(nodeA)
		Consistently(testenv.ReadyReason(cp.Client, lost), 3*leaseDuration, 100*time.Millisecond).Should(Equal(running))
		By("a crashlooping manager: its Lease expired, the kubelet renewing")
		renewManager(nodeA, leaseDuration)
		Consistently(testenv.ReadyReason(cp.Client, lost), 3*leaseDuration, 100*time.Millisecond).Should(Equal(running))
		By("a kubelet that stopped renewing while the manager renews")
		leases.set(nodeA, false, true)
		Consistently(testenv.ReadyReason(cp.Client, lost), 3*leaseDuration, 100*time.Millisecond).Should(Equal(running))
		leases.set(nodeA, true, true)
		Eventually(func() time.Time { return kubeletExpiry(nodeA) }, 5*time.Second, 100*time.Millisecond).Should(
			BeTemporally(">", time.Now().Add(leaseDuration/2)), "the kubelet renews again")
		Expect(quotaUsed(quotaKey)()).To(BeEquivalentTo(2))
	})

	It("marks a lost node's Sandboxes NodeLost as its Leases expire, releases their quota and refills the pool on the other node", func() {
		By("stopping node A: its manager goes, its kubelet stops renewing")
		managerA.Stop()
		leases.set(nodeA, false, false)
		deleteManagerLease(nodeA)
		expiry := kubeletExpiry(nodeA)
		Expect(expiry).To(BeTemporally(">", time.Now()), "the kubelet Lease was fresh when the node stopped")

		Eventually(testenv.ReadyReason(cp.Client, lost), 15*time.Second, 50*time.Millisecond).Should(Equal("False/" + sandboxv1alpha1.SandboxReasonNodeLost))
		sbx := get(lost)
		ready := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
		late := ready.LastTransitionTime.Sub(expiry)
		GinkgoWriter.Printf("NodeLost %v after the kubelet Lease expired\n", late)
		AddReportEntry("NodeLost after the kubelet Lease expired", late.String())
		// Requeued at the expiry itself, not at a resync; the condition's
		// time has one-second resolution.
		Expect(late).To(And(BeNumerically(">", -time.Second), BeNumerically("<", 2*time.Second)),
			"not before the kubelet's Lease expired, and at once after")
		Expect(ready.Message).To(And(ContainSubstring("node "+nodeA+" is lost"), ContainSubstring("kubelet"), ContainSubstring("manager's Lease is gone")))
		Expect(sbx.Status.NodeName).To(Equal(nodeA), "nothing else of the status changes")
		Expect(sbx.Status.ContainerID).NotTo(BeEmpty())

		By("refusing exec and files with a typed error naming the reason")
		err := subresource.CheckReady(sbx)
		Expect(err).To(HaveOccurred())
		Expect(subresource.HasCause(err.Status("exec"), subresource.CauseSandboxNotReady)).To(BeTrue())
		Expect(err.Message).To(ContainSubstring("NodeLost"))

		By("releasing the quota charge")
		Eventually(testenv.ReadyReason(cp.Client, deleted), 5*time.Second).Should(Equal("False/" + sandboxv1alpha1.SandboxReasonNodeLost))
		Eventually(quotaUsed(quotaKey), 20*time.Second).Should(BeEquivalentTo(0))

		By("replacing the pool's member on node B, and releasing the old one")
		Eventually(members(poolNS, "pool"), testenv.ReadyTimeout).Should(Equal(map[string]int{nodeB: 1}))
		Eventually(gone(client.ObjectKeyFromObject(memberA)), 20*time.Second).Should(BeTrue(),
			"the lost member is deleted, and its finalizer released by the control plane")

		By("deleting a NodeLost Sandbox while its node is still away")
		Expect(cp.Client.Delete(ctx, get(deleted))).To(Succeed())
		Eventually(gone(deleted), 20*time.Second).Should(BeTrue())

		// Node A's containers are still there: nobody could reach them.
		Expect(containersOf(lostUID)()).To(HaveLen(1))
		Expect(containersOf(delUID)()).To(HaveLen(1))
		Expect(containersOf(memberA.UID)()).To(HaveLen(1))
	})

	It("keeps NodeLost when the node returns: its manager removes the containers, recreates none, and deletion completes", func() {
		leases.set(nodeA, true, true)
		managerA = testnode.Start(cp, nil, testnode.NodeOptions{Name: nodeA})

		for what, uid := range map[string]types.UID{"the NodeLost Sandbox": lostUID, "the Sandbox deleted meanwhile": delUID, "the lost member": memberA.UID} {
			Eventually(containersOf(uid), 30*time.Second).Should(BeEmpty(), what)
		}
		Consistently(func() string {
			if n := len(containersOf(lostUID)()); n > 0 {
				return fmt.Sprintf("%d container(s)", n)
			}
			return testenv.ReadyReason(cp.Client, lost)()
		}, 3*time.Second, 200*time.Millisecond).Should(Equal("False/"+sandboxv1alpha1.SandboxReasonNodeLost),
			"terminal: no container again, and the status stays NodeLost")
		Expect(quotaUsed(quotaKey)()).To(BeEquivalentTo(0))
		Expect(members(poolNS, "pool")()).To(Equal(map[string]int{nodeB: 1}), "no duplicate member")

		Expect(cp.Client.Delete(ctx, get(lost))).To(Succeed())
		Eventually(gone(lost), 30*time.Second).Should(BeTrue())
	})
})
