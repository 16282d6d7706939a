/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxwarmpool_test

import (
	"context"
	"sort"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

const (
	timeout  = 20 * time.Second
	interval = 50 * time.Millisecond
	// settle is how long a pool is watched for doing what it must not.
	settle = 2 * time.Second
)

var ctx = context.Background()

func template() sandboxv1alpha1.SandboxTemplate {
	return sandboxv1alpha1.SandboxTemplate{
		Image: testenv.BusyboxImage,
		Resources: sandboxv1alpha1.SandboxResources{
			CPU:    ptr.To(resource.MustParse("100m")),
			Memory: ptr.To(resource.MustParse("16Mi")),
			Disk:   ptr.To(resource.MustParse("8Mi")),
		},
	}
}

// newNamespace creates a namespace and, since envtest runs no namespace
// controller or garbage collector, deletes what the spec left in it.
func newNamespace() string {
	GinkgoHelper()
	ns := cp.NewNamespace("warmpool-")
	DeferCleanup(func() {
		Expect(cp.Client.DeleteAllOf(ctx, &sandboxv1alpha1.SandboxWarmPool{}, client.InNamespace(ns))).To(Succeed())
		Expect(cp.Client.DeleteAllOf(ctx, &sandboxv1alpha1.Sandbox{}, client.InNamespace(ns))).To(Succeed())
		Expect(cp.Client.DeleteAllOf(ctx, &sandboxv1alpha1.SandboxQuota{}, client.InNamespace(ns))).To(Succeed())
	})
	return ns
}

func newPool(ns, name string, replicas int32) *sandboxv1alpha1.SandboxWarmPool {
	GinkgoHelper()
	pool := &sandboxv1alpha1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       sandboxv1alpha1.SandboxWarmPoolSpec{Replicas: ptr.To(replicas), Template: template()},
	}
	Expect(cp.Client.Create(ctx, pool)).To(Succeed())
	return pool
}

func getPool(pool *sandboxv1alpha1.SandboxWarmPool) *sandboxv1alpha1.SandboxWarmPool {
	GinkgoHelper()
	out := &sandboxv1alpha1.SandboxWarmPool{}
	Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(pool), out)).To(Succeed())
	return out
}

func updatePool(pool *sandboxv1alpha1.SandboxWarmPool, mutate func(*sandboxv1alpha1.SandboxWarmPool)) {
	GinkgoHelper()
	Eventually(func() error {
		p := &sandboxv1alpha1.SandboxWarmPool{}
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pool), p); err != nil {
			return err
		}
		mutate(p)
		return cp.Client.Update(ctx, p)
	}, timeout, interval).Should(Succeed())
}

// members lists the pool's live members (not deleting), oldest first.
func members(g Gomega, pool *sandboxv1alpha1.SandboxWarmPool) []sandboxv1alpha1.Sandbox {
	var list sandboxv1alpha1.SandboxList
	g.Expect(cp.Client.List(ctx, &list, client.InNamespace(pool.Namespace))).To(Succeed())
	var out []sandboxv1alpha1.Sandbox
	for _, s := range list.Items {
		if warmpool.IsMemberOf(&s, pool) && s.DeletionTimestamp.IsZero() {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// waitMembers waits until the pool has n live members and returns them.
func waitMembers(pool *sandboxv1alpha1.SandboxWarmPool, n int) []sandboxv1alpha1.Sandbox {
	GinkgoHelper()
	var out []sandboxv1alpha1.Sandbox
	Eventually(func(g Gomega) {
		out = members(g, pool)
		g.Expect(out).To(HaveLen(n))
	}, timeout, interval).Should(Succeed())
	return out
}

// writeStatus updates a Sandbox's status as its node manager would.
func writeStatus(sbx *sandboxv1alpha1.Sandbox, mutate func(*sandboxv1alpha1.SandboxStatus)) {
	GinkgoHelper()
	Eventually(func() error {
		s := &sandboxv1alpha1.Sandbox{}
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(sbx), s); err != nil {
			return err
		}
		mutate(&s.Status)
		return cp.Client.Status().Update(ctx, s)
	}, timeout, interval).Should(Succeed())
}

func condition(t sandboxv1alpha1.ConditionType, status metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: string(t), Status: status, Reason: reason, Message: msg, LastTransitionTime: metav1.Now()}
}

// bind is a node manager claiming the member and starting to provision it.
func bind(sbx *sandboxv1alpha1.Sandbox, node string) {
	GinkgoHelper()
	writeStatus(sbx, func(st *sandboxv1alpha1.SandboxStatus) {
		st.NodeName = node
		meta.SetStatusCondition(&st.Conditions, condition(sandboxv1alpha1.SandboxConditionReady, metav1.ConditionFalse,
			sandboxv1alpha1.SandboxReasonProvisioning, "creating the container"))
	})
}

// pause is a node manager having created, started and frozen the member:
// it is idle.
func pause(sbx *sandboxv1alpha1.Sandbox, node string) {
	GinkgoHelper()
	writeStatus(sbx, func(st *sandboxv1alpha1.SandboxStatus) {
		st.NodeName = node
		st.ContainerID = "container-" + string(sbx.UID)
		meta.SetStatusCondition(&st.Conditions, condition(sandboxv1alpha1.SandboxConditionReady, metav1.ConditionFalse,
			sandboxv1alpha1.SandboxReasonPaused, "paused"))
		meta.SetStatusCondition(&st.Conditions, condition(sandboxv1alpha1.SandboxConditionPaused, metav1.ConditionTrue,
			sandboxv1alpha1.SandboxReasonPaused, "frozen"))
	})
}

func fail(sbx *sandboxv1alpha1.Sandbox, reason, msg string) {
	GinkgoHelper()
	writeStatus(sbx, func(st *sandboxv1alpha1.SandboxStatus) {
		meta.SetStatusCondition(&st.Conditions, condition(sandboxv1alpha1.SandboxConditionPaused, metav1.ConditionFalse,
			reason, msg))
		meta.SetStatusCondition(&st.Conditions, condition(sandboxv1alpha1.SandboxConditionReady, metav1.ConditionFalse,
			reason, msg))
	})
}

func readyOf(pool *sandboxv1alpha1.SandboxWarmPool) *metav1.Condition {
	return meta.FindStatusCondition(pool.Status.Conditions, string(sandboxv1alpha1.SandboxWarmPoolConditionReady))
}

// expectStatus waits until the pool's status says so for its current
// generation.
func expectStatus(pool *sandboxv1alpha1.SandboxWarmPool, replicas, ready int32, reason string, msg ...string) *sandboxv1alpha1.SandboxWarmPool {
	GinkgoHelper()
	var out *sandboxv1alpha1.SandboxWarmPool
	Eventually(func(g Gomega) {
		out = &sandboxv1alpha1.SandboxWarmPool{}
		g.Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(pool), out)).To(Succeed())
		g.Expect(out.Status.ObservedGeneration).To(Equal(out.Generation))
		g.Expect(out.Status.Replicas).To(Equal(replicas), "status.replicas")
		g.Expect(out.Status.ReadyReplicas).To(Equal(ready), "status.readyReplicas")
		c := readyOf(out)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(reason))
		want := metav1.ConditionFalse
		if reason == sandboxv1alpha1.SandboxWarmPoolReasonFilled {
			want = metav1.ConditionTrue
		}
		g.Expect(c.Status).To(Equal(want))
		g.Expect(c.ObservedGeneration).To(Equal(out.Generation))
		for _, m := range msg {
			g.Expect(c.Message).To(ContainSubstring(m))
		}
	}, timeout, interval).Should(Succeed())
	return out
}

func uids(sandboxes []sandboxv1alpha1.Sandbox) []types.UID {
	out := make([]types.UID, len(sandboxes))
	for i := range sandboxes {
		out[i] = sandboxes[i].UID
	}
	return out
}

func gone(sbx *sandboxv1alpha1.Sandbox) {
	GinkgoHelper()
	Eventually(func() bool {
		err := cp.Client.Get(ctx, client.ObjectKeyFromObject(sbx), &sandboxv1alpha1.Sandbox{})
		return apierrors.IsNotFound(err)
	}, timeout, interval).Should(BeTrue(), "%s should have been deleted", sbx.Name)
}

var _ = Describe("SandboxWarmPool", func() {
	It("creates spec.replicas paused members from the template, no more, and is Filled once all are idle", func() {
		ns := newNamespace()
		pool := newPool(ns, "py", 3)

		ms := waitMembers(pool, 3)
		pool = getPool(pool)
		hash := warmpool.Hash(pool.Spec.Template)
		for _, m := range ms {
			Expect(m.Spec.Paused).To(BeTrue())
			Expect(m.Spec.Image).To(Equal(testenv.BusyboxImage))
			Expect(m.Spec.Resources.Memory.String()).To(Equal("16Mi"))
			Expect(m.Labels).To(HaveKeyWithValue(sandboxv1alpha1.LabelTemplateHash, hash))
			Expect(metav1.GetControllerOf(&m).UID).To(Equal(pool.UID))
		}
		// Reconciles that run before the cache shows the new members must
		// not create them again.
		Consistently(func(g Gomega) { g.Expect(members(g, pool)).To(HaveLen(3)) }, settle, interval).Should(Succeed())

		filling := expectStatus(pool, 3, 0, sandboxv1alpha1.SandboxWarmPoolReasonFilling, "0 of 3 members idle")
		Expect(filling.Status.Selector).To(Equal(sandboxv1alpha1.LabelWarmPool + "=py"))

		pause(&ms[0], "node-a")
		expectStatus(pool, 3, 1, sandboxv1alpha1.SandboxWarmPoolReasonFilling, "1 of 3 members idle")
		pause(&ms[1], "node-a")
		pause(&ms[2], "node-b")
		expectStatus(pool, 3, 3, sandboxv1alpha1.SandboxWarmPoolReasonFilled, "3 of 3 members idle")
		Expect(waitMembers(pool, 3)).To(HaveLen(3))
	})

	It("scales through the scale subresource, deleting members that are not idle first", func() {
		ns := newNamespace()
		pool := newPool(ns, "scaled", 3)
		ms := waitMembers(pool, 3)
		pause(&ms[0], "node-a")
		pause(&ms[2], "node-a")
		bind(&ms[1], "node-a") // provisioning: the cheapest to give up
		expectStatus(pool, 3, 2, sandboxv1alpha1.SandboxWarmPoolReasonFilling)

		scale := &autoscalingv1.Scale{}
		Expect(cp.Client.SubResource("scale").Get(ctx, pool, scale)).To(Succeed())
		Expect(scale.Spec.Replicas).To(Equal(int32(3)))
		Expect(scale.Status.Replicas).To(Equal(int32(3)))
		Expect(scale.Status.Selector).To(Equal(sandboxv1alpha1.LabelWarmPool + "=scaled"))

		scale.Spec.Replicas = 2
		Expect(cp.Client.SubResource("scale").Update(ctx, pool, client.WithSubResourceBody(scale))).To(Succeed())
		gone(&ms[1])
		Expect(uids(waitMembers(pool, 2))).To(ConsistOf(ms[0].UID, ms[2].UID))
		expectStatus(pool, 2, 2, sandboxv1alpha1.SandboxWarmPoolReasonFilled)

		scale = &autoscalingv1.Scale{}
		Expect(cp.Client.SubResource("scale").Get(ctx, pool, scale)).To(Succeed())
		scale.Spec.Replicas = 4
		Expect(cp.Client.SubResource("scale").Update(ctx, pool, client.WithSubResourceBody(scale))).To(Succeed())
		Expect(uids(waitMembers(pool, 4))).To(ContainElements(ms[0].UID, ms[2].UID))
		expectStatus(pool, 4, 2, sandboxv1alpha1.SandboxWarmPoolReasonFilling)

		kept := map[types.UID]bool{ms[0].UID: true, ms[2].UID: true}
		ms = waitMembers(pool, 4)
		for i := range ms {
			if !kept[ms[i].UID] {
				pause(&ms[i], "node-b")
			}
		}
		expectStatus(pool, 4, 4, sandboxv1alpha1.SandboxWarmPoolReasonFilled)
		updatePool(pool, func(p *sandboxv1alpha1.SandboxWarmPool) { p.Spec.Replicas = ptr.To[int32](0) })
		waitMembers(pool, 0)
		expectStatus(pool, 0, 0, sandboxv1alpha1.SandboxWarmPoolReasonFilled)
	})

	It("deletes members whose container a Sandbox claimed, or that report Claimed, and refills", func() {
		ns := newNamespace()
		pool := newPool(ns, "claims", 2)
		ms := waitMembers(pool, 2)
		pause(&ms[0], "node-a")
		pause(&ms[1], "node-a")
		expectStatus(pool, 2, 2, sandboxv1alpha1.SandboxWarmPoolReasonFilled)

		claimant := &sandboxv1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "claimant"},
			Spec:       sandboxv1alpha1.SandboxSpec{WarmPoolRef: &sandboxv1alpha1.WarmPoolReference{Name: "claims"}},
		}
		Expect(cp.Client.Create(ctx, claimant)).To(Succeed())
		// Nothing happens to the pool until a manager records the claim.
		Consistently(func(g Gomega) { g.Expect(uids(members(g, pool))).To(ConsistOf(ms[0].UID, ms[1].UID)) }, settle, interval).Should(Succeed())

		writeStatus(claimant, func(st *sandboxv1alpha1.SandboxStatus) {
			st.NodeName = "node-a"
			st.WarmPool = &sandboxv1alpha1.SandboxWarmPoolClaimStatus{
				Member:       &sandboxv1alpha1.WarmPoolMemberReference{Name: ms[0].Name, UID: ms[0].UID},
				TemplateHash: ms[0].Labels[sandboxv1alpha1.LabelTemplateHash],
			}
		})
		gone(&ms[0])
		after := waitMembers(pool, 2)
		Expect(uids(after)).To(ContainElement(ms[1].UID))
		Expect(uids(after)).NotTo(ContainElement(ms[0].UID))
		expectStatus(pool, 2, 1, sandboxv1alpha1.SandboxWarmPoolReasonFilling)
		// The claimant itself is not the pool's to delete.
		Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(claimant), &sandboxv1alpha1.Sandbox{})).To(Succeed())

		// A member the manager marks Claimed before the claimant's status
		// shows it goes as well.
		fail(&ms[1], sandboxv1alpha1.SandboxReasonClaimed, "claimed by claimant-2")
		gone(&ms[1])
		after = waitMembers(pool, 2)
		Expect(uids(after)).NotTo(ContainElements(ms[0].UID, ms[1].UID))
	})

	It("replaces members that broke, and reports members that cannot start as MembersFailing", func() {
		ns := newNamespace()
		pool := newPool(ns, "broken", 3)
		ms := waitMembers(pool, 3)
		for i := range ms {
			pause(&ms[i], "node-a")
		}
		expectStatus(pool, 3, 3, sandboxv1alpha1.SandboxWarmPoolReasonFilled)

		fail(&ms[0], sandboxv1alpha1.SandboxReasonOOMKilled, "killed for exceeding 16Mi")
		fail(&ms[1], sandboxv1alpha1.SandboxReasonContainerExited, "exit code 1")
		gone(&ms[0])
		gone(&ms[1])
		after := waitMembers(pool, 3)
		Expect(uids(after)).To(ContainElement(ms[2].UID))
		expectStatus(pool, 3, 1, sandboxv1alpha1.SandboxWarmPoolReasonFilling)

		// A member that cannot start is kept (its manager retries it and a
		// replacement would fail alike) and named in the condition.
		var fresh *sandboxv1alpha1.Sandbox
		for i := range after {
			if after[i].UID != ms[2].UID {
				fresh = &after[i]
				break
			}
		}
		fail(fresh, sandboxv1alpha1.SandboxReasonImageNotFound, "ImagePullFailed: image not found")
		expectStatus(pool, 3, 1, sandboxv1alpha1.SandboxWarmPoolReasonMembersFailing,
			"member "+fresh.Name+": ImageNotFound: ImagePullFailed: image not found")
		Consistently(func(g Gomega) { g.Expect(uids(members(g, pool))).To(ContainElement(fresh.UID)) }, settle, interval).Should(Succeed())
	})

	It("rolls a new template out by replacing stale members, with at most one replacement in flight per node", func() {
		ns := newNamespace()
		pool := newPool(ns, "roll", 4)
		old := waitMembers(pool, 4)
		onNode := map[types.UID]string{}
		for i := range old {
			node := []string{"node-a", "node-b"}[i%2]
			pause(&old[i], node)
			onNode[old[i].UID] = node
		}
		expectStatus(pool, 4, 4, sandboxv1alpha1.SandboxWarmPoolReasonFilled)
		oldHash := old[0].Labels[sandboxv1alpha1.LabelTemplateHash]

		updatePool(pool, func(p *sandboxv1alpha1.SandboxWarmPool) { p.Spec.Template.Command = []string{"sleep", "infinity"} })
		pool = getPool(pool)
		newHash := warmpool.Hash(pool.Spec.Template)
		Expect(newHash).NotTo(Equal(oldHash))

		// split returns the live members made from each template.
		split := func(g Gomega) (stale, fresh []sandboxv1alpha1.Sandbox) {
			for _, m := range members(g, pool) {
				if m.Labels[sandboxv1alpha1.LabelTemplateHash] == newHash {
					fresh = append(fresh, m)
				} else {
					stale = append(stale, m)
				}
			}
			return stale, fresh
		}
		staleNodes := func(stale []sandboxv1alpha1.Sandbox) []string {
			var out []string
			for _, s := range stale {
				out = append(out, onNode[s.UID])
			}
			return out
		}

		// One stale member per node goes at once; their replacements are
		// not bound yet, so they may land on either node and hold back
		// both.
		var stale, fresh []sandboxv1alpha1.Sandbox
		Eventually(func(g Gomega) {
			stale, fresh = split(g)
			g.Expect(staleNodes(stale)).To(ConsistOf("node-a", "node-b"))
			g.Expect(fresh).To(HaveLen(2))
		}, timeout, interval).Should(Succeed())
		Consistently(func(g Gomega) {
			s, f := split(g)
			g.Expect(s).To(HaveLen(2))
			g.Expect(f).To(HaveLen(2))
		}, settle, interval).Should(Succeed())
		for _, f := range fresh {
			Expect(f.Spec.Command).To(Equal([]string{"sleep", "infinity"}))
		}
		expectStatus(pool, 4, 0, sandboxv1alpha1.SandboxWarmPoolReasonRollingOut, "2 of 4 members were made from an older template")

		// node-a's replacement is still starting, node-b's is idle: only
		// node-b's last stale member goes.
		bind(&fresh[0], "node-a")
		pause(&fresh[1], "node-b")
		onNode[fresh[0].UID], onNode[fresh[1].UID] = "node-a", "node-b"
		var third []sandboxv1alpha1.Sandbox
		Eventually(func(g Gomega) {
			s, f := split(g)
			g.Expect(staleNodes(s)).To(ConsistOf("node-a"))
			g.Expect(f).To(HaveLen(3))
			third = f
		}, timeout, interval).Should(Succeed())
		Consistently(func(g Gomega) {
			s, _ := split(g)
			g.Expect(staleNodes(s)).To(ConsistOf("node-a"))
		}, settle, interval).Should(Succeed())

		// The newest replacement lands on node-b and becomes idle; node-a
		// still has its replacement in flight, so its stale member stays.
		for i := range third {
			if _, known := onNode[third[i].UID]; !known {
				pause(&third[i], "node-b")
				onNode[third[i].UID] = "node-b"
			}
		}
		Consistently(func(g Gomega) {
			s, _ := split(g)
			g.Expect(staleNodes(s)).To(ConsistOf("node-a"))
		}, settle, interval).Should(Succeed())

		// node-a's replacement is idle at last: the last stale member goes.
		pause(&fresh[0], "node-a")
		var last []sandboxv1alpha1.Sandbox
		Eventually(func(g Gomega) {
			s, f := split(g)
			g.Expect(s).To(BeEmpty())
			g.Expect(f).To(HaveLen(4))
			last = f
		}, timeout, interval).Should(Succeed())
		for i := range last {
			if _, known := onNode[last[i].UID]; !known {
				pause(&last[i], "node-a")
			}
		}
		expectStatus(pool, 4, 4, sandboxv1alpha1.SandboxWarmPoolReasonFilled)
	})

	It("removes the members of a deleted pool, and only those", func() {
		ns := newNamespace()
		pool := newPool(ns, "doomed", 2)
		ms := waitMembers(pool, 2)
		// Labelled like a member but controlled by no pool: a user's own
		// Sandbox, which must survive.
		bystander := &sandboxv1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bystander", Labels: map[string]string{sandboxv1alpha1.LabelWarmPool: "doomed"}},
			Spec:       sandboxv1alpha1.SandboxSpec{Image: testenv.BusyboxImage},
		}
		Expect(cp.Client.Create(ctx, bystander)).To(Succeed())

		Expect(cp.Client.Delete(ctx, pool)).To(Succeed())
		gone(&ms[0])
		gone(&ms[1])
		Consistently(func() error {
			return cp.Client.Get(ctx, client.ObjectKeyFromObject(bystander), &sandboxv1alpha1.Sandbox{})
		}, settle, interval).Should(Succeed())
	})

	It("replaces the members of an earlier pool of the same name", func() {
		ns := newNamespace()
		first := newPool(ns, "reborn", 2)
		oldMembers := waitMembers(first, 2)
		Expect(cp.Client.Delete(ctx, first)).To(Succeed())
		second := newPool(ns, "reborn", 1)
		gone(&oldMembers[0])
		gone(&oldMembers[1])
		waitMembers(second, 1)
		Consistently(func(g Gomega) {
			var list sandboxv1alpha1.SandboxList
			g.Expect(cp.Client.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
			g.Expect(list.Items).To(HaveLen(1))
			g.Expect(metav1.GetControllerOf(&list.Items[0]).UID).To(Equal(second.UID))
		}, settle, interval).Should(Succeed())
	})

	It("shows a quota refusal as MembersFailing without retrying in a loop, and fills once the quota allows", func() {
		ns := newNamespace()
		q := &sandboxv1alpha1.SandboxQuota{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team"},
			Spec:       sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](2)}},
		}
		Expect(cp.Client.Create(ctx, q)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(q), q)).To(Succeed())
			g.Expect(q.Status.ObservedGeneration).To(Equal(q.Generation))
		}, timeout, interval).Should(Succeed())

		pool := newPool(ns, "capped", 3)
		waitMembers(pool, 2)
		expectStatus(pool, 2, 0, sandboxv1alpha1.SandboxWarmPoolReasonMembersFailing,
			"creating members: ", `sandbox quota "team" exceeded`)
		// Two creates admitted, then a refusal and retries on a growing
		// backoff (1s, 2s, 4s, 8s, ...): a handful of attempts, not a loop.
		attempts := creates.get(ns)
		Consistently(func(g Gomega) { g.Expect(members(g, pool)).To(HaveLen(2)) }, 8*time.Second, interval).Should(Succeed())
		Expect(creates.get(ns) - attempts).To(BeNumerically("<=", 3))

		// Raising the quota requeues the pool past its backoff.
		Eventually(func() error {
			if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(q), q); err != nil {
				return err
			}
			q.Spec.Hard.Sandboxes = ptr.To[int64](3)
			return cp.Client.Update(ctx, q)
		}, timeout, interval).Should(Succeed())
		// The next retry is about 7s away by now: filling sooner proves
		// the quota watch.
		Eventually(func(g Gomega) { g.Expect(members(g, pool)).To(HaveLen(3)) }, 4*time.Second, interval).Should(Succeed())
		expectStatus(pool, 3, 0, sandboxv1alpha1.SandboxWarmPoolReasonFilling)
	})

	It("gives members the shortest lifetime the namespace's quotas demand, so that they are admitted", func() {
		ns := newNamespace()
		for name, max := range map[string]int64{"long": 7200, "short": 600} {
			q := &sandboxv1alpha1.SandboxQuota{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec:       sandboxv1alpha1.SandboxQuotaSpec{MaxActiveDeadlineSeconds: ptr.To(max)},
			}
			Expect(cp.Client.Create(ctx, q)).To(Succeed())
			Eventually(func(g Gomega) {
				g.Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(q), q)).To(Succeed())
				g.Expect(q.Status.ObservedGeneration).To(Equal(q.Generation))
			}, timeout, interval).Should(Succeed())
		}
		pool := newPool(ns, "recycled", 2)
		for _, m := range waitMembers(pool, 2) {
			Expect(m.Spec.ActiveDeadlineSeconds).To(HaveValue(BeEquivalentTo(600)), m.Name)
		}
	})
})
