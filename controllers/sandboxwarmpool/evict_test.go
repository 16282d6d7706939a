/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxwarmpool_test

import (
	"encoding/json"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrladmission "sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/admission"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// A claimant at a full quota displaces an idle member. Admission only
// decides that it fits once a member goes; the pool controller evicts the
// member, and only for a claimant that exists.
var _ = Describe("SandboxWarmPool at a full quota", func() {
	// fullPool is a pool of two idle members that fill a quota of two.
	fullPool := func() (string, *sandboxv1alpha1.SandboxWarmPool, []sandboxv1alpha1.Sandbox) {
		GinkgoHelper()
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
		pool := newPool(ns, "pool", 2)
		ms := waitMembers(pool, 2)
		for i := range ms {
			pause(&ms[i], "node-a")
		}
		expectStatus(pool, 2, 2, sandboxv1alpha1.SandboxWarmPoolReasonFilled)
		Eventually(func(g Gomega) {
			g.Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(q), q)).To(Succeed())
			g.Expect(q.Status.Reservations).To(BeEmpty())
			g.Expect(q.Status.Used.Sandboxes).To(Equal(int64(2)))
		}, timeout, interval).Should(Succeed())
		// As they are now: idle.
		return ns, pool, waitMembers(pool, 2)
	}
	claimant := func(ns string) *sandboxv1alpha1.Sandbox {
		return &sandboxv1alpha1.Sandbox{
			TypeMeta:   metav1.TypeMeta{APIVersion: sandboxv1alpha1.GroupVersion.String(), Kind: "Sandbox"},
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "claim-"},
			Spec:       sandboxv1alpha1.SandboxSpec{WarmPoolRef: &sandboxv1alpha1.WarmPoolReference{Name: "pool"}},
		}
	}

	It("loses no member to an admitted claimant that is never stored (a forged or later-refused review)", func() {
		ns, pool, ms := fullPool()
		// The webhook's handler, called as a forged AdmissionReview (or
		// one a later webhook refuses) would reach it: the claimant it
		// admits never exists.
		validator := admission.NewSandboxValidator(cp.Client, cp.Client, cp.Scheme, clock.RealClock{})
		forged := claimant(ns)
		forged.Name, forged.UID = "forged", "forged-uid"
		obj, err := json.Marshal(forged)
		Expect(err).NotTo(HaveOccurred())
		resp := validator.Handle(ctx, ctrladmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			UID: "forged-request", Operation: admissionv1.Create, Namespace: ns, Name: forged.Name,
			Object: runtime.RawExtension{Raw: obj}, DryRun: ptr.To(false)}})
		Expect(resp.Allowed).To(BeTrue(), "%+v", resp.Result)
		Consistently(func(g Gomega) {
			g.Expect(uids(members(g, pool))).To(ConsistOf(uids(ms)))
		}, 3*time.Second, interval).Should(Succeed())
	})

	It("evicts the newest idle member once a claimant exists and holds none, and no more", func() {
		ns, pool, ms := fullPool()
		newest := warmpool.IdleMembers(ms, pool)[0]
		c := claimant(ns)
		Expect(cp.Client.Create(ctx, c)).To(Succeed())
		gone(newest)
		// The quota is full again (the claimant and one member): nothing
		// more is evicted, and the pool cannot refill.
		Consistently(func(g Gomega) {
			left := members(g, pool)
			g.Expect(left).To(HaveLen(1))
			g.Expect(left[0].UID).NotTo(Equal(newest.UID))
		}, 3*time.Second, interval).Should(Succeed())
	})

	It("evicts nothing for a claimant while the quota has room", func() {
		ns, pool, ms := fullPool()
		q := &sandboxv1alpha1.SandboxQuota{}
		Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "team"}, q)).To(Succeed())
		q.Spec.Hard.Sandboxes = ptr.To[int64](3)
		Expect(cp.Client.Update(ctx, q)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(q), q)).To(Succeed())
			g.Expect(q.Status.ObservedGeneration).To(Equal(q.Generation))
		}, timeout, interval).Should(Succeed())
		Expect(cp.Client.Create(ctx, claimant(ns))).To(Succeed())
		Consistently(func(g Gomega) {
			g.Expect(uids(members(g, pool))).To(ConsistOf(uids(ms)))
		}, 3*time.Second, interval).Should(Succeed())
	})
})

// Every manager and the webhook cache every pool: one pool's size is paid
// in every process, so its template is capped in all, not only per item.
var _ = Describe("SandboxWarmPool validation", func() {
	It("refuses a template command over 64 KiB in all, naming the limit, and accepts one of 64 KiB", func() {
		ns := newNamespace()
		command := func(n int) []string {
			out := make([]string, n)
			for i := range out {
				out[i] = strings.Repeat("x", 4096)
			}
			return out
		}
		pool := &sandboxv1alpha1.SandboxWarmPool{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "big"},
			Spec:       sandboxv1alpha1.SandboxWarmPoolSpec{Replicas: ptr.To[int32](0), Template: template()},
		}
		pool.Spec.Template.Command = command(17)
		Expect(cp.Client.Create(ctx, pool, client.DryRunAll)).To(MatchError(ContainSubstring("command must total at most 65536 bytes")))
		pool.Spec.Template.Command = command(16)
		Expect(cp.Client.Create(ctx, pool, client.DryRunAll)).To(Succeed())
	})
})

// SandboxQuota counts Sandboxes, members included, but not the pools
// themselves, whose templates every manager caches. Their number is capped
// with Kubernetes' own object-count quota, which kube-apiserver charges at
// admission (docs/quota.md).
var _ = Describe("SandboxWarmPools under a ResourceQuota object count", func() {
	It("refuses the pool past count/sandboxwarmpools.sandbox.code-sandbox.dev", func() {
		ns := newNamespace()
		name := corev1.ResourceName("count/sandboxwarmpools." + sandboxv1alpha1.GroupVersion.Group)
		rq := &corev1.ResourceQuota{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pools"},
			Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{name: resource.MustParse("2")}},
		}
		Expect(cp.Client.Create(ctx, rq)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(cp.Client.Delete(ctx, rq))).To(Succeed()) })
		// envtest runs no kube-controller-manager: write the first count
		// as its quota controller would; from then on kube-apiserver's
		// ResourceQuota admission charges every create itself.
		rq.Status = corev1.ResourceQuotaStatus{Hard: rq.Spec.Hard, Used: corev1.ResourceList{name: resource.MustParse("0")}}
		Expect(cp.Client.Status().Update(ctx, rq)).To(Succeed())
		for _, n := range []string{"one", "two"} {
			newPool(ns, n, 0)
		}
		err := cp.Client.Create(ctx, &sandboxv1alpha1.SandboxWarmPool{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "three"},
			Spec:       sandboxv1alpha1.SandboxWarmPoolSpec{Replicas: ptr.To[int32](0), Template: template()},
		})
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err).To(MatchError(ContainSubstring("exceeded quota: pools")))
	})
})
