/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/controllers/sandboxwarmpool"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// These specs play the pool controller themselves (creating members and
// deleting claimed ones), so that they pin the node manager's half of warm
// pools: members provisioned and frozen, claims, and the container handed
// over intact.
var _ = Describe("Warm pool claims", func() {
	var ns string
	ctx := context.Background()
	BeforeEach(func() { ns = newNamespace() })

	newPool := func(name string) *sandboxv1alpha1.SandboxWarmPool {
		GinkgoHelper()
		pool := &sandboxv1alpha1.SandboxWarmPool{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: sandboxv1alpha1.SandboxWarmPoolSpec{
				Replicas: ptr.To[int32](0),
				Template: sandboxv1alpha1.SandboxTemplate{
					Image:     busyboxImage,
					Resources: sandboxv1alpha1.SandboxResources{Memory: ptr.To(resource.MustParse("96Mi"))},
				},
			},
		}
		Expect(k8sClient.Create(ctx, pool)).To(Succeed())
		return pool
	}
	// idleMember creates a member of pool and waits until the manager has
	// provisioned and frozen it.
	idleMember := func(pool *sandboxv1alpha1.SandboxWarmPool) *sandboxv1alpha1.Sandbox {
		GinkgoHelper()
		m := createSandbox(warmpool.Member(pool))
		key := client.ObjectKeyFromObject(m)
		Eventually(func() bool { return warmpool.Idle(getSandbox(key)) }, 60*time.Second, 100*time.Millisecond).Should(BeTrue())
		m = getSandbox(key)
		Expect(inspect(m.Status.ContainerID).State.Paused).To(BeTrue(), "an idle member's container is frozen")
		return m
	}
	claimant := func(name, pool string, mutate ...func(*sandboxv1alpha1.Sandbox)) *sandboxv1alpha1.Sandbox {
		return newSandbox(ns, name, "", append([]func(*sandboxv1alpha1.Sandbox){func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Image = ""
			s.Spec.WarmPoolRef = &sandboxv1alpha1.WarmPoolReference{Name: pool}
		}}, mutate...)...)
	}

	It("hands an idle member's container to a claimant, clean, and keeps it when the member goes", func() {
		node := testNodePrefix + "warm"
		m := startManager(node, managerConfig{})
		pool := newPool("warm")
		member := idleMember(pool)
		// status.startTime has a resolution of a second: let one pass, so
		// that a lifetime counted from the member's start would show.
		time.Sleep(1100 * time.Millisecond)

		sbx := waitReady(createSandbox(claimant("claimant", pool.Name, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Env = []sandboxv1alpha1.EnvVar{{Name: "GREETING", Value: "hello"}}
			s.Spec.ActiveDeadlineSeconds = ptr.To[int64](600)
		})))
		key := client.ObjectKeyFromObject(sbx)
		Expect(claimReason(sbx)).To(Equal("True/WarmPoolClaimed"))
		Expect(sbx.Status.WarmPool.Member.UID).To(Equal(member.UID))
		Expect(sbx.Status.ContainerID).To(Equal(member.Status.ContainerID))
		Expect(sbx.Status.WarmPool.TemplateHash).To(Equal(warmpool.Hash(pool.Spec.Template)))
		Expect(sbx.ContainerUID()).To(Equal(member.UID))
		id := sbx.Status.ContainerID
		// Ready is written while Docker thaws (the node API waits for the
		// thaw); the raw Docker calls below do not, so they wait here.
		Eventually(func() bool { return inspect(id).State.Paused }, 5*time.Second, 20*time.Millisecond).Should(BeFalse())
		ct := inspect(id)
		Expect(ct.State.Running).To(BeTrue())
		Expect(ct.HostConfig.Memory).To(Equal(int64(96<<20)), "the container has the template's shape")
		// Indistinguishable from a fresh sandbox: empty writable paths, one
		// process (the idle one) besides the resident helper that every
		// sandbox starts with (dockerruntime's prestart; the member's health
		// check ran in it), a lifetime counted from the claim.
		Expect(dockerExecOutput(id, "ls", "-A", "/app", "/tmp")).To(Equal("/app:\n\n/tmp:\n"))
		// In any order: the resident helper's start may win the race with
		// the container's command to the next PID.
		Expect(strings.Fields(dockerExecOutput(id, "ps", "-o", "comm"))).To(ConsistOf("COMMAND", "docker-init", "idle", "helper", "ps"),
			"only the init, the idle process, the resident helper and ps itself run")
		Expect(sbx.Status.StartTime.Time).To(BeTemporally(">", member.Status.StartTime.Time))

		// The member records the handover, and its deletion (the pool
		// controller's job) leaves the container to the claimant.
		Eventually(readyReason(client.ObjectKeyFromObject(member)), 10*time.Second).Should(Equal("False/Claimed"))
		Expect(k8sClient.Delete(ctx, member)).To(Succeed())
		Eventually(isGone(client.ObjectKeyFromObject(member)), 20*time.Second).Should(BeTrue())
		_, err := m.reconciler.CollectOrphans(ctx)
		Expect(err).NotTo(HaveOccurred())
		Consistently(func() bool { return inspect(id).State.Running }, 2*time.Second, 200*time.Millisecond).Should(BeTrue())
		Expect(readyReason(key)()).To(Equal("True/Running"))

		// A Docker event of the handed-over container reaches the claimant.
		Expect(docker.ContainerKill(ctx, id, "KILL")).To(Succeed())
		Eventually(readyReason(key), 20*time.Second, 100*time.Millisecond).Should(Equal("False/ContainerExited"))

		Expect(k8sClient.Delete(ctx, getSandbox(key))).To(Succeed())
		Eventually(isGone(key), 30*time.Second).Should(BeTrue())
		Expect(containersOf(member.UID)).To(BeEmpty(), "deleting the claimant removes the container it took over")
	})

	It("falls back to a cold create from the template when no member is idle", func() {
		node := testNodePrefix + "cold"
		startManager(node, managerConfig{})
		pool := newPool("empty")
		sbx := waitReady(createSandbox(claimant("cold", pool.Name)))
		Expect(claimReason(sbx)).To(Equal("False/WarmPoolEmpty"))
		Expect(sbx.Status.WarmPool.Member).To(BeNil())
		Expect(sbx.ContainerUID()).To(Equal(sbx.UID))
		Expect(inspect(sbx.Status.ContainerID).HostConfig.Memory).To(Equal(int64(96 << 20)))
		Expect(containersOf(sbx.UID)).To(HaveLen(1))
	})

	It("waits for a missing pool, then claims from it", func() {
		node := testNodePrefix + "nopool"
		startManager(node, managerConfig{})
		sbx := createSandbox(claimant("early", "later"))
		key := client.ObjectKeyFromObject(sbx)
		Eventually(readyReason(key), 20*time.Second, 100*time.Millisecond).Should(Equal("False/WarmPoolNotFound"))
		Expect(getSandbox(key).Status.NodeName).To(BeEmpty(), "nothing is claimed for a pool that does not exist")
		newPool("later")
		waitReady(sbx)
	})

	It("never hands out a forged member: the pool's labels and controller ownerReference with a spec of its own", func() {
		node := testNodePrefix + "forged"
		startManager(node, managerConfig{})
		pool := newPool("forged")
		// As an editor's CREATE was admitted on 90280d9 (here by the
		// cluster administrator, past any admission): paused, 2 CPUs,
		// 2 GiB, an environment of its own; everything else the
		// template's, labels and ownerReference included.
		forged := warmpool.Member(pool)
		forged.Spec.Resources.CPU = ptr.To(resource.MustParse("2"))
		forged.Spec.Resources.Memory = ptr.To(resource.MustParse("2Gi"))
		forged.Spec.Env = []sandboxv1alpha1.EnvVar{{Name: "FORGED", Value: "1"}}
		forged = createSandbox(forged)
		fkey := client.ObjectKeyFromObject(forged)
		Eventually(func() bool { return warmpool.Idle(getSandbox(fkey)) }, 60*time.Second, 100*time.Millisecond).Should(BeTrue(),
			"the manager provisions and freezes it like a member")
		forged = getSandbox(fkey)
		Expect(warmpool.IsMemberOf(forged, pool)).To(BeTrue(), "its labels and ownerReference are a member's")

		for _, name := range []string{"first", "second"} {
			sbx := waitReady(createSandbox(claimant(name, pool.Name)))
			Expect(claimReason(sbx)).To(Equal("False/WarmPoolEmpty"), "the forged member is not idle for claims")
			Expect(sbx.Status.ContainerID).NotTo(Equal(forged.Status.ContainerID))
			Expect(sbx.ContainerUID()).To(Equal(sbx.UID))
			ct := inspect(sbx.Status.ContainerID)
			Expect(ct.HostConfig.Memory).To(Equal(int64(96<<20)), "the claimant's container has the template's shape")
			Expect(ct.Config.Env).NotTo(ContainElement("FORGED=1"))
		}
		Expect(readyReason(fkey)()).To(Equal("False/Paused"), "the forged member's container is still its own, frozen")
		Expect(inspect(forged.Status.ContainerID).State.Paused).To(BeTrue())
	})

	It("claims nothing from a pool being deleted, warm or cold", func() {
		node := testNodePrefix + "terminating"
		startManager(node, managerConfig{})
		pool := newPool("terminating")
		member := idleMember(pool)
		// Anyone who may update the pool can hold it in Terminating with a
		// finalizer of their own; envtest runs no garbage collector, so
		// the member stays too.
		pool.Finalizers = []string{"example.com/hold"}
		Expect(k8sClient.Update(ctx, pool)).To(Succeed())
		Expect(k8sClient.Delete(ctx, pool)).To(Succeed())
		DeferCleanup(func() {
			p := &sandboxv1alpha1.SandboxWarmPool{}
			if k8sClient.Get(ctx, client.ObjectKeyFromObject(pool), p) == nil {
				p.Finalizers = nil
				Expect(client.IgnoreNotFound(k8sClient.Update(ctx, p))).To(Succeed())
			}
		})

		sbx := createSandbox(claimant("late", pool.Name))
		key := client.ObjectKeyFromObject(sbx)
		Eventually(readyReason(key), 20*time.Second, 100*time.Millisecond).Should(Equal("False/WarmPoolNotFound"))
		Expect(meta.FindStatusCondition(getSandbox(key).Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady)).Message).
			To(ContainSubstring(`SandboxWarmPool "terminating" in namespace ` + ns + " is being deleted; nothing is claimed from it"))
		Consistently(func() string { return getSandbox(key).Status.NodeName }, 3*time.Second, 200*time.Millisecond).Should(BeEmpty())
		Expect(getSandbox(key).Status.WarmPool).To(BeNil())
		Expect(containersOf(sbx.UID)).To(BeEmpty())
		Expect(inspect(member.Status.ContainerID).State.Paused).To(BeTrue(), "the member was not thawed for anyone")
	})

	It("does not recreate a member whose container was removed behind its back", func() {
		node := testNodePrefix + "gone"
		startManager(node, managerConfig{})
		member := idleMember(newPool("gone"))
		key := client.ObjectKeyFromObject(member)
		Expect(docker.ContainerRemove(ctx, member.Status.ContainerID, container.RemoveOptions{Force: true})).To(Succeed())
		Eventually(readyReason(key), 20*time.Second, 100*time.Millisecond).Should(Equal("False/ContainerMissing"))
		Consistently(containerCount(member.UID), 3*time.Second, 250*time.Millisecond).Should(BeZero())
		Expect(warmpool.Idle(getSandbox(key))).To(BeFalse())
	})

	It("keeps a claimed container across a manager restart and the member's deletion", func() {
		node := testNodePrefix + "restart"
		m := startManager(node, managerConfig{})
		pool := newPool("restart")
		member := idleMember(pool)
		sbx := waitReady(createSandbox(claimant("survivor", pool.Name)))
		Expect(sbx.Status.WarmPool.Member.UID).To(Equal(member.UID))
		m.stop()

		// The new manager knows the handover only from the API (the cache
		// index of status.warmPool.member), not from memory.
		m = startManager(node, managerConfig{})
		Expect(k8sClient.Delete(ctx, member)).To(Succeed())
		Eventually(isGone(client.ObjectKeyFromObject(member)), 20*time.Second).Should(BeTrue())
		_, err := m.reconciler.CollectOrphans(ctx)
		Expect(err).NotTo(HaveOccurred())
		Consistently(readyReason(client.ObjectKeyFromObject(sbx)), 2*time.Second, 200*time.Millisecond).Should(Equal("True/Running"))
		Expect(inspect(sbx.Status.ContainerID).State.Running).To(BeTrue())
	})

	It("never hands out a member again once a claimant used it, even when the claimant vanished", func() {
		node := testNodePrefix + "vanish"
		startManager(node, managerConfig{})
		pool := newPool("vanish")
		member := idleMember(pool)
		sbx := waitReady(createSandbox(claimant("vanisher", pool.Name)))
		id := sbx.Status.ContainerID
		memberKey := client.ObjectKeyFromObject(member)
		Eventually(readyReason(memberKey), 10*time.Second).Should(Equal("False/Claimed"))

		// The claimant goes without its finalizer running (stripped by hand).
		// The manager puts a stripped finalizer back, so the delete is
		// conditional on the stripped version: otherwise finalize may run
		// and remove the container, which is not what this spec is about.
		Eventually(func() error {
			latest := getSandbox(client.ObjectKeyFromObject(sbx))
			latest.Finalizers = nil
			if err := k8sClient.Update(ctx, latest); err != nil {
				return err
			}
			stripped := latest.ResourceVersion
			return k8sClient.Delete(ctx, latest, client.Preconditions{ResourceVersion: &stripped})
		}, 10*time.Second, 50*time.Millisecond).Should(Succeed())
		Eventually(isGone(client.ObjectKeyFromObject(sbx)), 20*time.Second).Should(BeTrue())
		Consistently(func() bool { return warmpool.Idle(getSandbox(memberKey)) }, 3*time.Second, 200*time.Millisecond).Should(BeFalse())
		Expect(readyReason(memberKey)()).To(Equal("False/Claimed"))
		Expect(inspect(id).State.Paused).To(BeFalse(), "the used container is not frozen back into the pool")

		// Deleting the member (the pool controller's job) removes it.
		Expect(k8sClient.Delete(ctx, getSandbox(memberKey))).To(Succeed())
		Eventually(isGone(memberKey), 20*time.Second).Should(BeTrue())
		Eventually(containerCount(member.UID), 20*time.Second, 200*time.Millisecond).Should(BeZero())
	})

	It("gives each member to one claimant when claims race", func() {
		node := testNodePrefix + "race"
		startManager(node, managerConfig{maxSandboxes: 40})
		pool := newPool("race")
		members := map[types.UID]bool{}
		for range 3 {
			members[idleMember(pool).UID] = true
		}
		var claimants []*sandboxv1alpha1.Sandbox
		for i := range 8 {
			claimants = append(claimants, createSandbox(claimant("race-"+string(rune('a'+i)), pool.Name)))
		}
		taken := map[types.UID]int{}
		warm := 0
		for _, c := range claimants {
			got := waitReady(c)
			if got.Status.WarmPool.Member != nil {
				warm++
				taken[got.Status.WarmPool.Member.UID]++
				Expect(members).To(HaveKey(got.Status.WarmPool.Member.UID))
			}
		}
		Expect(warm).To(Equal(3), "every idle member is taken and no more")
		for uid, n := range taken {
			Expect(n).To(Equal(1), "member %s was handed out %d times", uid, n)
		}
	})
})

// This spec runs the pool controller next to the node manager: the whole
// cluster-side lifecycle of a pool, and a burst of claims against it.
var _ = Describe("Warm pool with its controller", func() {
	ctx := context.Background()

	poolStatus := func(key types.NamespacedName) func() string {
		return func() string {
			pool := &sandboxv1alpha1.SandboxWarmPool{}
			if err := k8sClient.Get(ctx, key, pool); err != nil {
				return err.Error()
			}
			return fmt.Sprintf("replicas=%d ready=%d", pool.Status.Replicas, pool.Status.ReadyReplicas)
		}
	}

	It("serves 50 concurrent claims from a pool of 10: no double assignment, 10 warm, 40 cold, all Ready, then refills", func() {
		ns := newNamespace()
		node := testNodePrefix + "burst"
		startManager(node, managerConfig{maxSandboxes: 80})
		stopPool := startPoolController()
		pool := &sandboxv1alpha1.SandboxWarmPool{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "burst"},
			Spec: sandboxv1alpha1.SandboxWarmPoolSpec{
				Replicas: ptr.To[int32](10),
				Template: sandboxv1alpha1.SandboxTemplate{
					Image:     busyboxImage,
					Resources: sandboxv1alpha1.SandboxResources{Memory: ptr.To(resource.MustParse("32Mi"))},
				},
			},
		}
		Expect(k8sClient.Create(ctx, pool)).To(Succeed())
		// The pool goes with the spec, or a pool controller of a later spec
		// would keep filling it on that spec's managers.
		DeferCleanup(func() {
			_ = k8sClient.Delete(context.Background(), pool)
			_ = k8sClient.DeleteAllOf(context.Background(), &sandboxv1alpha1.Sandbox{}, client.InNamespace(ns))
		})
		key := client.ObjectKeyFromObject(pool)
		Eventually(poolStatus(key), 120*time.Second, 250*time.Millisecond).Should(Equal("replicas=10 ready=10"))
		// Without the controller nothing refills during the burst, so the
		// split between warm and cold is exact.
		stopPool()

		const claims = 50
		var wg sync.WaitGroup
		errs := make(chan error, claims)
		for i := range claims {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer GinkgoRecover()
				sbx := &sandboxv1alpha1.Sandbox{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("claim-%02d", i)},
					Spec:       sandboxv1alpha1.SandboxSpec{WarmPoolRef: &sandboxv1alpha1.WarmPoolReference{Name: pool.Name}},
				}
				errs <- k8sClient.Create(ctx, sbx)
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			Expect(err).NotTo(HaveOccurred())
		}
		DeferCleanup(func() {
			_ = k8sClient.DeleteAllOf(context.Background(), &sandboxv1alpha1.Sandbox{}, client.InNamespace(ns))
		})

		var list sandboxv1alpha1.SandboxList
		Eventually(func() int {
			Expect(k8sClient.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
			ready := 0
			for i := range list.Items {
				if list.Items[i].Spec.WarmPoolRef != nil && meta.IsStatusConditionTrue(list.Items[i].Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady)) {
					ready++
				}
			}
			return ready
		}, 240*time.Second, time.Second).Should(Equal(claims))

		warm, cold := 0, 0
		members := map[types.UID]string{}
		containers := map[string]string{}
		for i := range list.Items {
			sbx := &list.Items[i]
			if sbx.Spec.WarmPoolRef == nil {
				continue
			}
			Expect(containers).NotTo(HaveKey(sbx.Status.ContainerID), "container shared by %s and %s", sbx.Name, containers[sbx.Status.ContainerID])
			containers[sbx.Status.ContainerID] = sbx.Name
			if m := sbx.Status.WarmPool.Member; m != nil {
				Expect(members).NotTo(HaveKey(m.UID), "member %s handed to %s and %s", m.Name, sbx.Name, members[m.UID])
				members[m.UID] = sbx.Name
				Expect(claimReason(sbx)).To(Equal("True/WarmPoolClaimed"))
				warm++
			} else {
				Expect(claimReason(sbx)).To(Equal("False/WarmPoolEmpty"))
				cold++
			}
		}
		Expect(warm).To(Equal(10))
		Expect(cold).To(Equal(40))

		// Back on duty, the controller deletes the claimed members and
		// refills the pool, leaving the claimants' containers alone.
		startPoolController()
		Eventually(poolStatus(key), 120*time.Second, 250*time.Millisecond).Should(Equal("replicas=10 ready=10"))
		for uid := range members {
			Expect(containersOf(uid)).To(HaveLen(1), "the container of claimed member %s is gone", uid)
		}
	})
})

var _ = Describe("Warm pool members over several nodes", func() {
	ctx := context.Background()

	It("go to the node with a live manager that holds the fewest, also when it runs no Sandbox yet", func() {
		ns, leases := newNamespace(), newNamespace()
		nodeA, nodeB := testNodePrefix+"spread-a", testNodePrefix+"spread-b"
		a := startManager(nodeA, managerConfig{maxSandboxes: 30, leaseNamespace: leases})
		startPoolController()
		pool := &sandboxv1alpha1.SandboxWarmPool{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "spread"},
			Spec: sandboxv1alpha1.SandboxWarmPoolSpec{
				Replicas: ptr.To[int32](2),
				Template: sandboxv1alpha1.SandboxTemplate{Image: busyboxImage},
			},
		}
		Expect(k8sClient.Create(ctx, pool)).To(Succeed())
		DeferCleanup(func() {
			_ = k8sClient.Delete(context.Background(), pool)
			_ = k8sClient.DeleteAllOf(context.Background(), &sandboxv1alpha1.Sandbox{}, client.InNamespace(ns))
		})
		idleByNode := func() map[string]int {
			var list sandboxv1alpha1.SandboxList
			Expect(k8sClient.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
			held := map[string]int{}
			for i := range list.Items {
				if warmpool.Idle(&list.Items[i]) {
					held[list.Items[i].Status.NodeName]++
				}
			}
			return held
		}
		// Alone, node A takes both.
		Eventually(idleByNode, 60*time.Second, 250*time.Millisecond).Should(Equal(map[string]int{nodeA: 2}))

		// Node B's manager starts: it runs nothing, and A knows it only by
		// its Lease.
		startManager(nodeB, managerConfig{maxSandboxes: 30, leaseNamespace: leases})
		Eventually(func() ([]string, error) { return a.reconciler.opts.LiveNodes(ctx) }, 10*time.Second, 200*time.Millisecond).
			Should(ConsistOf(nodeA, nodeB))
		updatePool := func(replicas int32) {
			Eventually(func() error {
				p := &sandboxv1alpha1.SandboxWarmPool{}
				if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(pool), p); err != nil {
					return err
				}
				p.Spec.Replicas = ptr.To(replicas)
				return k8sClient.Update(ctx, p)
			}).Should(Succeed())
		}
		// Both new members go to B: A holds two more than B and holds back
		// while B claims.
		updatePool(4)
		Eventually(idleByNode, 60*time.Second, 250*time.Millisecond).Should(Equal(map[string]int{nodeA: 2, nodeB: 2}))
		updatePool(6)
		Eventually(idleByNode, 60*time.Second, 250*time.Millisecond).Should(SatisfyAll(
			HaveKeyWithValue(nodeA, BeNumerically(">=", 2)), HaveKeyWithValue(nodeB, BeNumerically(">=", 2)),
			WithTransform(func(m map[string]int) int { return m[nodeA] + m[nodeB] }, Equal(6))))
		held := idleByNode()
		Expect(held[nodeA]-held[nodeB]).To(BeNumerically("<=", 2), "members spread %v", held)
	})
})

// startPoolController runs the SandboxWarmPool controller until the spec
// ends or stop is called.
func startPoolController() (stop func()) {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	Expect(err).NotTo(HaveOccurred())
	r := sandboxwarmpool.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), mgr.GetEventRecorder("sandboxwarmpool"),
		clock.RealClock{}, sandboxwarmpool.Options{SkipNameValidation: true})
	Expect(r.SetupWithManager(mgr)).To(Succeed())
	mctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		Expect(mgr.Start(mctx)).To(Succeed())
	}()
	stop = func() {
		cancel()
		Eventually(done, 30*time.Second).Should(BeClosed())
	}
	DeferCleanup(stop)
	return stop
}

// claimReason is a Sandbox's WarmPoolClaim condition as "Status/Reason".
func claimReason(sbx *sandboxv1alpha1.Sandbox) string {
	c := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionWarmPoolClaim))
	if c == nil {
		return ""
	}
	return string(c.Status) + "/" + c.Reason
}
