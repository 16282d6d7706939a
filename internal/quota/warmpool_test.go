/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package quota_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/quota"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

func template(image, cpu, mem, disk string) sandboxv1alpha1.SandboxTemplate {
	return sandboxv1alpha1.SandboxTemplate{Image: image, Resources: sandboxv1alpha1.SandboxResources{CPU: qp(cpu), Memory: qp(mem), Disk: qp(disk)}}
}

// claimant is a Sandbox with spec.warmPoolRef; its own resources are what a
// user might write there, which the pool's template overrides.
func claimant(uid, pool string) sandboxv1alpha1.Sandbox {
	sbx := sandbox(uid, "50m", "8Mi", "1Mi")
	sbx.Spec.WarmPoolRef = &sandboxv1alpha1.WarmPoolReference{Name: pool}
	return sbx
}

func claimed(sbx sandboxv1alpha1.Sandbox, member types.UID, t sandboxv1alpha1.SandboxTemplate) sandboxv1alpha1.Sandbox {
	sbx.Status.WarmPool = &sandboxv1alpha1.SandboxWarmPoolClaimStatus{TemplateHash: warmpool.Hash(t), Template: &t}
	if member != "" {
		sbx.Status.WarmPool.Member = &sandboxv1alpha1.WarmPoolMemberReference{Name: "sbx-" + string(member), UID: member}
	}
	return sbx
}

var _ = Describe("Warm pools", func() {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	current := template("busybox:1", "2", "1Gi", "512Mi")
	pools := warmpool.Templates{"pool": &current}
	charged := func(sbx *sandboxv1alpha1.Sandbox) *sandboxv1alpha1.Sandbox { return warmpool.Charged(sbx, pools) }

	Describe("warmpool.Charged", func() {
		It("returns a Sandbox without warmPoolRef as it is", func() {
			sbx := sandbox("a", "1", "1Gi", "1Gi")
			Expect(warmpool.Charged(&sbx, pools)).To(BeIdenticalTo(&sbx))
		})

		It("charges an unclaimed claimant with its pool's current template", func() {
			sbx := claimant("c", "pool")
			charged := warmpool.Charged(&sbx, pools)
			Expect(strs(quota.Usage(charged))).To(Equal([]any{int64(1), "2", "1Gi", "512Mi"}))
			Expect(charged.Spec.Image).To(Equal("busybox:1"))
			Expect(sbx.Spec.Image).To(BeEmpty(), "the Sandbox itself is not changed")
		})

		It("charges a claimed claimant with the template its manager recorded, whatever the pool says now", func() {
			sbx := claimed(claimant("c", "pool"), "m", template("busybox:1", "250m", "128Mi", "64Mi"))
			Expect(strs(quota.Usage(warmpool.Charged(&sbx, pools)))).To(Equal([]any{int64(1), "250m", "128Mi", "64Mi"}))
		})

		It("falls back to the claimant's own spec when the pool is gone", func() {
			sbx := claimant("c", "gone")
			Expect(strs(quota.Usage(warmpool.Charged(&sbx, pools)))).To(Equal([]any{int64(1), "50m", "8Mi", "1Mi"}))
		})
	})

	Describe("ClaimedMembers", func() {
		It("takes only claimants' status, never labels or ownerReferences", func() {
			member := sandbox("m", "", "", "")
			member.Labels = map[string]string{sandboxv1alpha1.LabelWarmPool: "pool"}
			self := claimed(claimant("s", "pool"), "s", current) // names itself: ignored
			// No spec.warmPoolRef: it never took a member over, whatever
			// its status says.
			noRef := claimed(sandbox("n", "", "", ""), "other", current)
			Expect(quota.ClaimedMembers([]sandboxv1alpha1.Sandbox{
				member, claimed(claimant("c", "pool"), "m", current), claimed(claimant("cold", "pool"), "", current), self, noRef,
			})).To(Equal(map[types.UID]bool{"m": true}))
		})
	})

	Describe("Count", func() {
		It("does not count a member another Sandbox claimed, and counts the claimant by its recorded template", func() {
			member := sandbox("m", "2", "1Gi", "512Mi")
			member.Labels = map[string]string{sandboxv1alpha1.LabelWarmPool: "pool"}
			idle := sandbox("idle", "2", "1Gi", "512Mi")
			r := quota.Count(nil, []sandboxv1alpha1.Sandbox{
				member,
				idle,
				claimed(claimant("c", "pool"), "m", template("busybox:1", "1", "256Mi", "128Mi")),
			}, nil, charged, nil, now, time.Minute)
			// idle (2, 1Gi, 512Mi) + c by its recorded template; m not at all.
			Expect(strs(r.Used)).To(Equal([]any{int64(2), "3", "1280Mi", "640Mi"}))
		})

		It("counts an unclaimed claimant with its pool's current template, and one whose pool is gone by its own spec", func() {
			r := quota.Count(nil, []sandboxv1alpha1.Sandbox{claimant("c", "pool"), claimant("d", "gone")}, nil, charged, nil, now, time.Minute)
			Expect(strs(r.Used)).To(Equal([]any{int64(2), "2050m", "1032Mi", "513Mi"}))
		})

		It("settles the reservation of a claimed member without charging it", func() {
			res := []sandboxv1alpha1.SandboxQuotaReservation{{Name: "sbx-m", UID: "m", Time: metav1.NewTime(now), Usage: usage(1, "2", "1Gi", "512Mi")}}
			r := quota.Count(res, []sandboxv1alpha1.Sandbox{sandbox("m", "2", "1Gi", "512Mi"), claimed(claimant("c", "pool"), "m", current)}, nil, charged, nil, now, time.Minute)
			Expect(r.Reservations).To(BeEmpty())
			Expect(strs(r.Used)).To(Equal([]any{int64(1), "2", "1Gi", "512Mi"}))
		})
	})

	Describe("ShapeViolations", func() {
		It("checks a template's image, runtime and egress but not the lifetime", func() {
			qt := &sandboxv1alpha1.SandboxQuota{ObjectMeta: metav1.ObjectMeta{Name: "team"}, Spec: sandboxv1alpha1.SandboxQuotaSpec{
				AllowedImages:            []string{"ghcr.io/acme/*"},
				AllowedRuntimes:          []sandboxv1alpha1.RuntimeClass{sandboxv1alpha1.RuntimeGVisor},
				MaxActiveDeadlineSeconds: ptr.To[int64](60),
			}}
			shape := func(t sandboxv1alpha1.SandboxTemplate) *sandboxv1alpha1.SandboxSpec {
				var spec sandboxv1alpha1.SandboxSpec
				warmpool.ApplyTemplate(&spec, t)
				return &spec
			}
			t := template("busybox:1", "1", "1Gi", "1Gi")
			t.Network.Mode = sandboxv1alpha1.NetworkEgress
			Expect(quota.ShapeViolations(qt, shape(t))).To(Equal([]string{
				`sandbox quota "team" does not allow image "busybox:1" (docker.io/library/busybox:1); allowed images: ghcr.io/acme/*`,
				`sandbox quota "team" does not allow runtime "runc"; allowed runtimes: gvisor`,
				`sandbox quota "team" does not allow network mode Egress (its allowEgress is false); use network mode None`,
			}))
			t = template("ghcr.io/acme/tool:1", "1", "1Gi", "1Gi")
			t.Runtime = sandboxv1alpha1.RuntimeGVisor
			Expect(quota.ShapeViolations(qt, shape(t))).To(BeEmpty())
		})
	})
})
