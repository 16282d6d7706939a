/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package admission_test

import (
	"context"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrladmission "sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/admission"
	"github.com/code-sandbox/code-sandbox-operator/internal/quota"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

func newPool(name, image, cpu string) *sandboxv1alpha1.SandboxWarmPool {
	return &sandboxv1alpha1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("pool-uid-" + name)},
		Spec: sandboxv1alpha1.SandboxWarmPoolSpec{Template: sandboxv1alpha1.SandboxTemplate{
			Image: image, Resources: sandboxv1alpha1.SandboxResources{CPU: ptr.To(resource.MustParse(cpu))},
		}},
	}
}

func newClaimant(name, uid, pool string) *sandboxv1alpha1.Sandbox {
	sbx := newSandbox(name, uid)
	sbx.Spec.Image = ""
	sbx.Spec.WarmPoolRef = &sandboxv1alpha1.WarmPoolReference{Name: pool}
	return sbx
}

// idleMember is a member of pool as a manager leaves it once paused.
func idleMember(pool *sandboxv1alpha1.SandboxWarmPool, name string, created time.Time) *sandboxv1alpha1.Sandbox {
	m := warmpool.Member(pool)
	m.Name, m.UID, m.CreationTimestamp = name, types.UID("uid-"+name), metav1.NewTime(created)
	m.Status.NodeName, m.Status.ContainerID = "node-a", "c-"+name
	m.Status.Conditions = []metav1.Condition{
		{Type: string(sandboxv1alpha1.SandboxConditionReady), Status: metav1.ConditionFalse, Reason: sandboxv1alpha1.SandboxReasonPaused, LastTransitionTime: metav1.NewTime(created)},
		{Type: string(sandboxv1alpha1.SandboxConditionPaused), Status: metav1.ConditionTrue, Reason: sandboxv1alpha1.SandboxReasonPaused, LastTransitionTime: metav1.NewTime(created)},
	}
	return m
}

func exists(e *env, name string) bool {
	GinkgoHelper()
	err := e.base.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &sandboxv1alpha1.Sandbox{})
	if apierrors.IsNotFound(err) {
		return false
	}
	Expect(err).NotTo(HaveOccurred())
	return true
}

var _ = Describe("SandboxValidator and warm pools", func() {
	ctx := context.Background()
	limit := func(n int64) sandboxv1alpha1.SandboxQuotaHard {
		return sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To(n)}
	}

	Describe("a claimant", func() {
		It("is charged with its pool template's resources", func() {
			e := newEnv(envOptions{}, newQuota("q", limit(5), quota.Zero()), newPool("pool", "busybox:1", "2"))
			expectAllowed(e.validator.Handle(ctx, createRequest(newClaimant("c", "uid-c", "pool"), false)))
			q := e.quota("q")
			Expect(q.Status.Reservations).To(HaveLen(1))
			Expect(q.Status.Reservations[0].Usage.CPU.String()).To(Equal("2"))
			Expect(q.Status.Used.CPU.String()).To(Equal("2"))
		})

		It("is checked against the rules as the template makes it, saying so", func() {
			qt := newQuota("q", limit(5), quota.Zero())
			qt.Spec.AllowedImages = []string{"ghcr.io/acme/*"}
			e := newEnv(envOptions{}, qt, newPool("pool", "busybox:1", "1"))
			Expect(expectDenied(e.validator.Handle(ctx, createRequest(newClaimant("c", "uid-c", "pool"), false)),
				`sandbox quota "q" does not allow image "busybox:1" (docker.io/library/busybox:1); allowed images: ghcr.io/acme/* (set by the template of SandboxWarmPool "pool")`)).
				To(Equal([]metav1.CauseType{subresource.CauseQuotaRule}))
		})

		It("is refused when its pool does not exist, naming it", func() {
			e := newEnv(envOptions{}, newQuota("q", limit(5), quota.Zero()))
			resp := e.validator.Handle(ctx, createRequest(newClaimant("c", "uid-c", "missing"), false))
			Expect(expectDenied(resp, `SandboxWarmPool "missing" does not exist in namespace team, so the Sandbox cannot be checked against the namespace's sandbox quotas; create the pool first`)).
				To(Equal([]metav1.CauseType{subresource.CauseWarmPoolNotFound}))
			Expect(resp.Result.Details.Causes[0].Field).To(Equal("spec.warmPoolRef.name"))
			expectUncharged(e, "q", quota.Zero())
		})

		It("is admitted without a pool when the namespace has no quota", func() {
			e := newEnv(envOptions{})
			expectAllowed(e.validator.Handle(ctx, createRequest(newClaimant("c", "uid-c", "missing"), false)))
		})

		Describe("at a full quota", func() {
			pool := newPool("pool", "busybox:1", "1")
			older := idleMember(pool, "older", now.Add(-time.Hour))
			newer := idleMember(pool, "newer", now.Add(-time.Minute))

			It("admits and charges the claimant over the limit, deleting nothing (the pool controller evicts once the claimant exists)", func() {
				e := newEnv(envOptions{}, newQuota("q", limit(2), usedN(2)), pool, older, newer)
				expectAllowed(e.validator.Handle(ctx, createRequest(newClaimant("c", "uid-c", "pool"), false)))
				// A forged or later-refused review must not cost a member.
				Expect(exists(e, "newer")).To(BeTrue())
				Expect(exists(e, "older")).To(BeTrue())
				q := e.quota("q")
				Expect(reservationUIDs(q)).To(Equal([]types.UID{"uid-c"}))
				// Counted again from what exists: both members and the
				// claimant, one over until a member is evicted, so that
				// nothing else fits meanwhile.
				Expect(quota.Equal(q.Status.Used, usedN(3))).To(BeTrue(), "used %+v", q.Status.Used)
				expectDenied(e.validator.Handle(ctx, createRequest(newSandbox("plain", "uid-plain"), false)),
					`sandbox quota "q" exceeded: sandboxes: requested 1, used 3, limit 2 (2 over)`)
			})

			It("admits one claimant per idle member, not more", func() {
				e := newEnv(envOptions{}, newQuota("q", limit(2), usedN(2)), pool, newer, newSandbox("running", "uid-running"))
				expectAllowed(e.validator.Handle(ctx, createRequest(newClaimant("c1", "uid-c1", "pool"), false)))
				expectDenied(e.validator.Handle(ctx, createRequest(newClaimant("c2", "uid-c2", "pool"), false)),
					`sandbox quota "q" exceeded: sandboxes: requested 1, used 3, limit 2 (2 over)`)
				Expect(exists(e, "newer")).To(BeTrue())
			})

			It("checks a dry run without deleting anything", func() {
				e := newEnv(envOptions{}, newQuota("q", limit(2), usedN(2)), pool, older, newer)
				expectAllowed(e.validator.Handle(ctx, createRequest(newClaimant("c", "uid-c", "pool"), true)))
				Expect(exists(e, "newer")).To(BeTrue())
				expectUncharged(e, "q", usedN(2))
			})

			It("is refused as before when no member is idle", func() {
				busy := idleMember(pool, "busy", now)
				busy.Status.Conditions = nil // provisioned but not paused
				other := newPool("other", "busybox:1", "1")
				stranger := idleMember(other, "stranger", now) // idle, but another pool's
				e := newEnv(envOptions{}, newQuota("q", limit(2), usedN(2)), pool, other, busy, stranger)
				Expect(expectDenied(e.validator.Handle(ctx, createRequest(newClaimant("c", "uid-c", "pool"), false)),
					`sandbox quota "q" exceeded: sandboxes: requested 1, used 2, limit 2 (1 over)`)).To(Equal([]metav1.CauseType{subresource.CauseQuotaExceeded}))
				Expect(exists(e, "busy")).To(BeTrue())
				Expect(exists(e, "stranger")).To(BeTrue())
			})

			It("does not take a member that only looks like one (label without the pool's controller reference)", func() {
				fake := idleMember(pool, "fake", now)
				fake.OwnerReferences = nil
				e := newEnv(envOptions{}, newQuota("q", limit(2), usedN(2)), pool, fake)
				expectDenied(e.validator.Handle(ctx, createRequest(newClaimant("c", "uid-c", "pool"), false)),
					`sandbox quota "q" exceeded: sandboxes: requested 1, used 2, limit 2 (1 over)`)
				Expect(exists(e, "fake")).To(BeTrue())
			})

			It("does not take a member another Sandbox already claimed", func() {
				taken := claimedBy(newClaimant("first", "uid-first", "pool"), newer)
				e := newEnv(envOptions{}, newQuota("q", limit(2), usedN(2)), pool, newer, taken)
				expectDenied(e.validator.Handle(ctx, createRequest(newClaimant("c", "uid-c", "pool"), false)),
					`sandbox quota "q" exceeded: sandboxes: requested 1, used 2, limit 2 (1 over)`)
				Expect(exists(e, "newer")).To(BeTrue())
			})
		})
	})

	Describe("membership", func() {
		pool := newPool("pool", "busybox:1", "1")
		member := func() *sandboxv1alpha1.Sandbox { return idleMember(pool, "m", now) }

		It("refuses making a Sandbox a member, or moving it, and allows other label changes", func() {
			e := newEnv(envOptions{}, pool)
			plain := newSandbox("sbx", "uid-1")
			labelled := plain.DeepCopy()
			labelled.Labels = map[string]string{sandboxv1alpha1.LabelWarmPool: "pool"}
			owned := plain.DeepCopy()
			owned.OwnerReferences = member().OwnerReferences
			moved := member()
			moved.Labels[sandboxv1alpha1.LabelWarmPool] = "other"
			for _, c := range []struct{ old, new *sandboxv1alpha1.Sandbox }{{plain, labelled}, {plain, owned}, {member(), moved}} {
				resp := e.validator.Handle(ctx, updateRequest(c.old, c.new))
				Expect(resp.Allowed).To(BeFalse())
				Expect(resp.Result.Code).To(Equal(int32(http.StatusForbidden)))
				Expect(subresource.HasCause(resp.Result, subresource.CauseWarmPoolMembership)).To(BeTrue(), "%+v", resp.Result)
			}
			other := member()
			other.Labels["team"] = "blue"
			expectAllowed(e.validator.Handle(ctx, updateRequest(member(), other)))
		})

		It("refuses creating a member (any mark of membership) to anyone but the pool controller, with or without quotas", func() {
			const poolController = "system:serviceaccount:code-sandbox-system:code-sandbox-webhook"
			// The forgery admitted on 90280d9: the pool's labels and a
			// controller ownerReference, paused, 2 CPUs and 2 GiB.
			forged := member()
			forged.Spec.Image = "attacker/image:1"
			forged.Spec.Resources.CPU = ptr.To(resource.MustParse("2"))
			forged.Spec.Resources.Memory = ptr.To(resource.MustParse("2Gi"))
			forged.Status = sandboxv1alpha1.SandboxStatus{}
			label := newSandbox("label", "uid-l")
			label.Labels = map[string]string{sandboxv1alpha1.LabelWarmPool: "pool"}
			hash := newSandbox("hash", "uid-h")
			hash.Labels = map[string]string{sandboxv1alpha1.LabelTemplateHash: warmpool.Hash(pool.Spec.Template)}
			owner := newSandbox("owner", "uid-o")
			owner.OwnerReferences = member().OwnerReferences
			owner.OwnerReferences[0].Controller = nil
			for _, objs := range [][]client.Object{{pool}, {pool, newQuota("q", limit(10), quota.Zero())}} {
				e := newEnv(envOptions{}, objs...)
				e.validator.WithPoolController(poolController)
				for _, c := range []struct {
					sbx   *sandboxv1alpha1.Sandbox
					field string
				}{{forged, "metadata.ownerReferences"}, {label, "metadata.labels"}, {hash, "metadata.labels"}, {owner, "metadata.ownerReferences"}} {
					for _, user := range []string{"eve", "system:admin", "system:serviceaccount:team:code-sandbox-webhook"} {
						req := createRequest(c.sbx, false)
						req.UserInfo.Username = user
						resp := e.validator.Handle(ctx, req)
						expectDenied(resp, "only the warm pool controller creates warm pool members: a Sandbox created by "+user+
							" may not carry the sandbox.code-sandbox.dev/warm-pool or sandbox.code-sandbox.dev/template-hash label or an ownerReference to a SandboxWarmPool; claim from a pool with spec.warmPoolRef instead")
						Expect(resp.Result.Details.Causes).To(ConsistOf(metav1.StatusCause{Type: subresource.CauseWarmPoolMembership, Field: c.field, Message: resp.Result.Message}))
					}
				}
				Expect(e.statusUpdates.Load()).To(BeZero(), "nothing charged for a refused create")
				req := createRequest(member(), false)
				req.UserInfo.Username = poolController
				expectAllowed(e.validator.Handle(ctx, req))
				req = createRequest(newSandbox("plain", "uid-p"), false)
				req.UserInfo.Username = "eve"
				expectAllowed(e.validator.Handle(ctx, req))
			}
			// Without a pool controller named, nobody creates members.
			req := createRequest(member(), false)
			req.UserInfo.Username = poolController
			Expect(newEnv(envOptions{}, pool).validator.Handle(ctx, req).Allowed).To(BeFalse())
		})

		It("refuses leaving a pool that exists, and allows it once the pool is deleting or gone", func() {
			left := member()
			left.OwnerReferences = nil
			e := newEnv(envOptions{}, pool)
			expectDenied(e.validator.Handle(ctx, updateRequest(member(), left)),
				`Sandbox "m" is a member of SandboxWarmPool "pool": its sandbox.code-sandbox.dev/warm-pool label and controller ownerReference stay as the pool created them while the pool exists`)
			expectAllowed(newEnv(envOptions{}).validator.Handle(ctx, updateRequest(member(), left)))
			deleting := pool.DeepCopy()
			deleting.DeletionTimestamp = ptr.To(metav1.NewTime(now))
			deleting.Finalizers = []string{"orphan"}
			expectAllowed(newEnv(envOptions{}, deleting).validator.Handle(ctx, updateRequest(member(), left)))
		})
	})
})

func claimedBy(claimant, member *sandboxv1alpha1.Sandbox) *sandboxv1alpha1.Sandbox {
	claimant.Status.NodeName = member.Status.NodeName
	claimant.Status.WarmPool = &sandboxv1alpha1.SandboxWarmPoolClaimStatus{
		Member: &sandboxv1alpha1.WarmPoolMemberReference{Name: member.Name, UID: member.UID},
	}
	return claimant
}

var _ = Describe("WarmPoolValidator", func() {
	ctx := context.Background()
	request := func(op admissionv1.Operation, old, pool *sandboxv1alpha1.SandboxWarmPool) ctrladmission.Request {
		GinkgoHelper()
		r := ctrladmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			UID: "req", Operation: op, Namespace: ns, Name: pool.Name, Object: raw(pool),
		}}
		if old != nil {
			r.OldObject = raw(old)
		}
		return r
	}
	restrictive := func() *sandboxv1alpha1.SandboxQuota {
		q := newQuota("q", sandboxv1alpha1.SandboxQuotaHard{}, quota.Zero())
		q.Spec.AllowedImages = []string{"ghcr.io/acme/*"}
		q.Spec.MaxActiveDeadlineSeconds = ptr.To[int64](60)
		return q
	}

	It("refuses a pool whose template a quota does not allow, as it would the Sandbox", func() {
		e := newEnv(envOptions{}, restrictive())
		v := admission.NewWarmPoolValidator(e.base, scheme)
		pool := newPool("pool", "busybox:1", "1")
		pool.Spec.Template.Network.Mode = sandboxv1alpha1.NetworkEgress
		resp := v.Handle(ctx, request(admissionv1.Create, nil, pool))
		Expect(resp.Allowed).To(BeFalse())
		Expect(resp.Result.Code).To(Equal(int32(http.StatusForbidden)))
		Expect(resp.Result.Message).To(Equal(`sandbox quota "q" does not allow image "busybox:1" (docker.io/library/busybox:1); allowed images: ghcr.io/acme/*; ` +
			`sandbox quota "q" does not allow network mode Egress (its allowEgress is false); use network mode None`))
		Expect(resp.Result.Details.Kind).To(Equal(subresource.StatusKindWarmPool))
		Expect(resp.Result.Details.Name).To(Equal("pool"))
		Expect(resp.Result.Details.Causes).To(HaveEach(HaveField("Type", subresource.CauseQuotaRule)))

		// The lifetime is each claimant's own: a pool is not refused for it.
		expectAllowed(v.Handle(ctx, request(admissionv1.Create, nil, newPool("pool", "ghcr.io/acme/tool:1", "1"))))
	})

	It("refuses growing a template in what a quota limits, so that a claimant admitted before is never claimed bigger", func() {
		hard := sandboxv1alpha1.SandboxQuotaHard{CPU: ptr.To(resource.MustParse("4")), Memory: ptr.To(resource.MustParse("4Gi"))}
		e := newEnv(envOptions{}, newQuota("q", hard, quota.Zero()))
		v := admission.NewWarmPoolValidator(e.base, scheme)
		small := newPool("pool", "busybox:1", "500m")
		big := newPool("pool", "busybox:1", "2")
		big.Spec.Template.Resources.Memory = ptr.To(resource.MustParse("2Gi"))
		resp := v.Handle(ctx, request(admissionv1.Update, small, big))
		Expect(resp.Allowed).To(BeFalse())
		Expect(resp.Result.Code).To(Equal(int32(http.StatusForbidden)))
		Expect(resp.Result.Details.Kind).To(Equal(subresource.StatusKindWarmPool))
		Expect(resp.Result.Details.Causes).To(ConsistOf(
			metav1.StatusCause{Type: subresource.CauseQuotaRule, Field: "spec.template.resources.cpu",
				Message: "the template's cpu may not grow from 500m to 2 while a sandbox quota of namespace team limits cpu: Sandboxes admitted at the old size may still claim from the pool; create a new pool for the bigger template"},
			HaveField("Field", "spec.template.resources.memory"),
		))
		// Shrinking, a dimension no quota limits, and other changes pass.
		expectAllowed(v.Handle(ctx, request(admissionv1.Update, big, small)))
		disk := small.DeepCopy()
		disk.Spec.Template.Resources.Disk = ptr.To(resource.MustParse("10Gi"))
		disk.Spec.Template.Image = "busybox:2"
		expectAllowed(v.Handle(ctx, request(admissionv1.Update, small, disk)))
		// Without a quota, templates change freely.
		expectAllowed(admission.NewWarmPoolValidator(newEnv(envOptions{}).base, scheme).Handle(ctx, request(admissionv1.Update, small, big)))
	})

	It("refuses re-creating a pool that Sandboxes admitted against the earlier one still wait for, with quotas", func() {
		waiting := newClaimant("waiting", "uid-w", "pool")
		claimed := claimedBy(newClaimant("claimed", "uid-c", "pool"), idleMember(newPool("pool", "busybox:1", "1"), "m", now))
		other := newClaimant("other", "uid-o", "other-pool")
		q := newQuota("q", sandboxv1alpha1.SandboxQuotaHard{CPU: ptr.To(resource.MustParse("4"))}, quota.Zero())
		v := admission.NewWarmPoolValidator(newEnv(envOptions{}, q, waiting, claimed, other).base, scheme)
		resp := v.Handle(ctx, request(admissionv1.Create, nil, newPool("pool", "busybox:1", "4")))
		Expect(resp.Allowed).To(BeFalse())
		Expect(resp.Result.Details.Causes).To(ConsistOf(metav1.StatusCause{Type: subresource.CauseQuotaRule, Field: "metadata.name",
			Message: `Sandboxes admitted against an earlier SandboxWarmPool "pool" still wait to claim from it (waiting), charged at its template; delete them, or name the new pool differently`}))
		expectAllowed(v.Handle(ctx, request(admissionv1.Create, nil, newPool("another", "busybox:1", "4"))))
		expectAllowed(admission.NewWarmPoolValidator(newEnv(envOptions{}, waiting).base, scheme).
			Handle(ctx, request(admissionv1.Create, nil, newPool("pool", "busybox:1", "4"))))
	})

	It("checks an update only when the template changes", func() {
		e := newEnv(envOptions{}, restrictive())
		v := admission.NewWarmPoolValidator(e.base, scheme)
		bad := newPool("pool", "busybox:1", "1")
		scaled := bad.DeepCopy()
		scaled.Spec.Replicas = ptr.To[int32](5)
		expectAllowed(v.Handle(ctx, request(admissionv1.Update, bad, scaled)))
		good := newPool("pool", "ghcr.io/acme/tool:1", "1")
		expectAllowed(v.Handle(ctx, request(admissionv1.Update, bad, good)))
		Expect(v.Handle(ctx, request(admissionv1.Update, good, bad)).Allowed).To(BeFalse())
	})

	It("allows any pool in a namespace without quotas", func() {
		v := admission.NewWarmPoolValidator(newEnv(envOptions{}).base, scheme)
		expectAllowed(v.Handle(ctx, request(admissionv1.Create, nil, newPool("pool", "anything:1", "1"))))
	})
})
