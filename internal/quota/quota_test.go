/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package quota_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/quota"
)

func q(s string) resource.Quantity { return resource.MustParse(s) }

func qp(s string) *resource.Quantity { return ptr.To(resource.MustParse(s)) }

func usage(n int64, cpu, mem, disk string) sandboxv1alpha1.SandboxQuotaUsage {
	return sandboxv1alpha1.SandboxQuotaUsage{Sandboxes: n, CPU: q(cpu), Memory: q(mem), Disk: q(disk)}
}

// strs renders a usage as the strings a user would see.
func strs(u sandboxv1alpha1.SandboxQuotaUsage) []any {
	return []any{u.Sandboxes, u.CPU.String(), u.Memory.String(), u.Disk.String()}
}

func sandbox(uid, cpu, mem, disk string) sandboxv1alpha1.Sandbox {
	sbx := sandboxv1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "sbx-" + uid, Namespace: "team", UID: types.UID(uid)}}
	if cpu != "" {
		sbx.Spec.Resources.CPU = qp(cpu)
	}
	if mem != "" {
		sbx.Spec.Resources.Memory = qp(mem)
	}
	if disk != "" {
		sbx.Spec.Resources.Disk = qp(disk)
	}
	return sbx
}

func expired(sbx sandboxv1alpha1.Sandbox, status metav1.ConditionStatus) sandboxv1alpha1.Sandbox {
	sbx.Status.Conditions = append(sbx.Status.Conditions, metav1.Condition{
		Type: string(sandboxv1alpha1.SandboxConditionExpired), Status: status, Reason: "Test", LastTransitionTime: metav1.Now(),
	})
	return sbx
}

var _ = Describe("Usage", func() {
	It("charges the CRD defaults for resources that are not set", func() {
		sbx := sandbox("a", "", "", "")
		u := quota.Usage(&sbx)
		Expect(strs(u)).To(Equal([]any{int64(1), "1", "512Mi", "256Mi"}))
	})

	It("charges what the Sandbox asks for", func() {
		sbx := sandbox("a", "250m", "1Gi", "64Mi")
		u := quota.Usage(&sbx)
		Expect(strs(u)).To(Equal([]any{int64(1), "250m", "1Gi", "64Mi"}))
	})

	It("mixes set and defaulted fields", func() {
		sbx := sandbox("a", "2", "", "1Gi")
		Expect(strs(quota.Usage(&sbx))).To(Equal([]any{int64(1), "2", "512Mi", "1Gi"}))
	})

	It("returns copies: changing the usage changes neither the Sandbox nor the defaults", func() {
		sbx := sandbox("a", "", "2Gi", "")
		u := quota.Usage(&sbx)
		u.CPU.Add(q("3"))
		u.Memory.Add(q("1Gi"))
		u.Disk.Add(q("1Gi"))
		Expect(sbx.Spec.Resources.Memory.String()).To(Equal("2Gi"))
		Expect(quota.DefaultCPU.String()).To(Equal("1"))
		Expect(quota.DefaultDisk.String()).To(Equal("256Mi"))
		again := sandbox("b", "", "", "")
		Expect(strs(quota.Usage(&again))).To(Equal([]any{int64(1), "1", "512Mi", "256Mi"}))
	})
})

var _ = Describe("Counts", func() {
	It("counts a plain Sandbox", func() {
		sbx := sandbox("a", "", "", "")
		Expect(quota.Counts(&sbx)).To(BeTrue())
	})

	It("does not count a Sandbox being deleted", func() {
		sbx := sandbox("a", "", "", "")
		sbx.DeletionTimestamp = ptr.To(metav1.Now())
		Expect(quota.Counts(&sbx)).To(BeFalse())
	})

	It("does not count an expired Sandbox", func() {
		sbx := expired(sandbox("a", "", "", ""), metav1.ConditionTrue)
		Expect(quota.Counts(&sbx)).To(BeFalse())
	})

	It("counts a Sandbox whose Expired condition is False or Unknown", func() {
		for _, st := range []metav1.ConditionStatus{metav1.ConditionFalse, metav1.ConditionUnknown} {
			sbx := expired(sandbox("a", "", "", ""), st)
			Expect(quota.Counts(&sbx)).To(BeTrue(), "Expired=%s", st)
		}
	})

	It("does not count a Sandbox whose node was lost (Ready=False, NodeLost)", func() {
		sbx := sandbox("a", "", "", "")
		sbx.Status.Conditions = []metav1.Condition{{Type: string(sandboxv1alpha1.SandboxConditionReady),
			Status: metav1.ConditionFalse, Reason: sandboxv1alpha1.SandboxReasonNodeLost}}
		Expect(quota.Counts(&sbx)).To(BeFalse())
	})

	It("counts a Sandbox whose NodeLost reason is on another condition, or on a Ready that is True", func() {
		for _, c := range []metav1.Condition{
			{Type: string(sandboxv1alpha1.SandboxConditionPaused), Status: metav1.ConditionFalse, Reason: sandboxv1alpha1.SandboxReasonNodeLost},
			{Type: string(sandboxv1alpha1.SandboxConditionReady), Status: metav1.ConditionTrue, Reason: sandboxv1alpha1.SandboxReasonNodeLost},
		} {
			sbx := sandbox("a", "", "", "")
			sbx.Status.Conditions = []metav1.Condition{c}
			Expect(quota.Counts(&sbx)).To(BeTrue(), "%s=%s", c.Type, c.Status)
		}
	})

	It("is not fooled by another condition being True", func() {
		sbx := sandbox("a", "", "", "")
		sbx.Status.Conditions = []metav1.Condition{{Type: string(sandboxv1alpha1.SandboxConditionReady), Status: metav1.ConditionTrue}}
		Expect(quota.Counts(&sbx)).To(BeTrue())
	})
})

var _ = Describe("Add, Sub and Equal", func() {
	It("adds into canonical form", func() {
		sum := quota.Add(usage(1, "1000m", "512Mi", "256Mi"), usage(0, "0", "0", "0"))
		Expect(strs(sum)).To(Equal([]any{int64(1), "1", "512Mi", "256Mi"}))
	})

	It("adds three 512Mi sandboxes to 1536Mi", func() {
		one := usage(1, "500m", "512Mi", "256Mi")
		sum := quota.Add(quota.Add(one, one), one)
		Expect(strs(sum)).To(Equal([]any{int64(3), "1500m", "1536Mi", "768Mi"}))
	})

	It("adds mixed units", func() {
		sum := quota.Add(usage(1, "1", "1Gi", "1Mi"), usage(2, "250m", "1024Mi", "1048576"))
		Expect(strs(sum)).To(Equal([]any{int64(3), "1250m", "2Gi", "2Mi"}))
	})

	It("prints the same whatever sums produced an amount", func() {
		a := quota.Add(usage(0, "500m", "256Mi", "0"), usage(0, "500m", "256Mi", "0"))
		b := quota.Add(usage(0, "1", "512Mi", "0"), quota.Zero())
		Expect(strs(a)).To(Equal(strs(b)))
	})

	It("does not change its arguments", func() {
		a, b := usage(1, "1", "1Gi", "1Gi"), usage(1, "1", "1Gi", "1Gi")
		quota.Add(a, b)
		quota.Sub(a, b)
		Expect(strs(a)).To(Equal([]any{int64(1), "1", "1Gi", "1Gi"}))
		Expect(strs(b)).To(Equal([]any{int64(1), "1", "1Gi", "1Gi"}))
	})

	It("subtracts", func() {
		diff := quota.Sub(usage(3, "1500m", "1536Mi", "768Mi"), usage(1, "500m", "512Mi", "256Mi"))
		Expect(strs(diff)).To(Equal([]any{int64(2), "1", "1Gi", "512Mi"}))
	})

	It("never goes below zero, field by field", func() {
		diff := quota.Sub(usage(0, "500m", "256Mi", "1Gi"), usage(1, "1", "512Mi", "256Mi"))
		Expect(strs(diff)).To(Equal([]any{int64(0), "0", "0", "768Mi"}))
		Expect(diff.CPU.Sign()).To(Equal(0))
		Expect(diff.Memory.Sign()).To(Equal(0))
	})

	It("subtracting from zero stays zero", func() {
		Expect(quota.Equal(quota.Sub(quota.Zero(), usage(5, "5", "5Gi", "5Gi")), quota.Zero())).To(BeTrue())
	})

	It("has a canonical zero", func() {
		Expect(strs(quota.Zero())).To(Equal([]any{int64(0), "0", "0", "0"}))
	})

	It("compares amounts, not spellings", func() {
		Expect(quota.Equal(usage(1, "1000m", "1024Mi", "1Gi"), usage(1, "1", "1Gi", "1073741824"))).To(BeTrue())
		base := usage(1, "1", "1Gi", "1Gi")
		Expect(quota.Equal(base, usage(2, "1", "1Gi", "1Gi"))).To(BeFalse())
		Expect(quota.Equal(base, usage(1, "1001m", "1Gi", "1Gi"))).To(BeFalse())
		Expect(quota.Equal(base, usage(1, "1", "1025Mi", "1Gi"))).To(BeFalse())
		Expect(quota.Equal(base, usage(1, "1", "1Gi", "1G"))).To(BeFalse())
	})
})

var _ = Describe("Exceeds and ExceededMessage", func() {
	req := usage(1, "1", "512Mi", "256Mi")

	It("finds nothing when no limit is set", func() {
		Expect(quota.Exceeds(sandboxv1alpha1.SandboxQuotaHard{}, usage(1000, "1000", "1000Gi", "1000Gi"), req)).To(BeEmpty())
	})

	It("allows a request that exactly reaches every limit", func() {
		hard := sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](3), CPU: qp("3"), Memory: qp("1536Mi"), Disk: qp("768Mi")}
		Expect(quota.Exceeds(hard, usage(2, "2000m", "1Gi", "512Mi"), req)).To(BeEmpty())
	})

	DescribeTable("names the one limit exceeded",
		func(hard sandboxv1alpha1.SandboxQuotaHard, used sandboxv1alpha1.SandboxQuotaUsage, want string) {
			over := quota.Exceeds(hard, used, req)
			Expect(over).To(HaveLen(1))
			Expect(over[0].String()).To(Equal(want))
			Expect(quota.ExceededMessage("team", over)).To(Equal(`sandbox quota "team" exceeded: ` + want))
		},
		Entry("sandboxes", sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](2)}, usage(2, "0", "0", "0"),
			"sandboxes: requested 1, used 2, limit 2 (1 over)"),
		Entry("cpu", sandboxv1alpha1.SandboxQuotaHard{CPU: qp("2")}, usage(1, "1500m", "0", "0"),
			"cpu: requested 1, used 1500m, limit 2 (500m over)"),
		Entry("cpu with a non-canonical limit", sandboxv1alpha1.SandboxQuotaHard{CPU: qp("1.5")}, usage(1, "1", "0", "0"),
			"cpu: requested 1, used 1, limit 1500m (500m over)"),
		Entry("memory", sandboxv1alpha1.SandboxQuotaHard{Memory: qp("1Gi")}, usage(1, "0", "768Mi", "0"),
			"memory: requested 512Mi, used 768Mi, limit 1Gi (256Mi over)"),
		Entry("memory with a fractional limit", sandboxv1alpha1.SandboxQuotaHard{Memory: qp("0.75Gi")}, usage(1, "0", "512Mi", "0"),
			"memory: requested 512Mi, used 512Mi, limit 768Mi (256Mi over)"),
		Entry("disk", sandboxv1alpha1.SandboxQuotaHard{Disk: qp("256Mi")}, usage(1, "0", "0", "1Mi"),
			"disk: requested 256Mi, used 1Mi, limit 256Mi (1Mi over)"),
		Entry("a zero sandbox limit refuses the first one", sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](0)}, quota.Zero(),
			"sandboxes: requested 1, used 0, limit 0 (1 over)"),
		Entry("a zero cpu limit refuses everything", sandboxv1alpha1.SandboxQuotaHard{CPU: qp("0")}, quota.Zero(),
			"cpu: requested 1, used 0, limit 0 (1 over)"),
		Entry("a zero memory limit refuses everything", sandboxv1alpha1.SandboxQuotaHard{Memory: qp("0")}, quota.Zero(),
			"memory: requested 512Mi, used 0, limit 0 (512Mi over)"),
		Entry("a zero disk limit refuses everything", sandboxv1alpha1.SandboxQuotaHard{Disk: qp("0")}, quota.Zero(),
			"disk: requested 256Mi, used 0, limit 0 (256Mi over)"),
		Entry("usage already above a lowered limit", sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](1)}, usage(3, "0", "0", "0"),
			"sandboxes: requested 1, used 3, limit 1 (3 over)"),
	)

	It("reports several limits at once, in the order sandboxes, cpu, memory, disk", func() {
		hard := sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](1), CPU: qp("1"), Memory: qp("512Mi"), Disk: qp("256Mi")}
		over := quota.Exceeds(hard, usage(1, "1", "512Mi", "256Mi"), req)
		Expect(over).To(HaveLen(4))
		Expect(over[0]).To(Equal(quota.Overage{Resource: "sandboxes", Requested: "1", Used: "1", Hard: "1", Over: "1"}))
		Expect(over[1]).To(Equal(quota.Overage{Resource: "cpu", Requested: "1", Used: "1", Hard: "1", Over: "1"}))
		Expect(over[2]).To(Equal(quota.Overage{Resource: "memory", Requested: "512Mi", Used: "512Mi", Hard: "512Mi", Over: "512Mi"}))
		Expect(over[3]).To(Equal(quota.Overage{Resource: "disk", Requested: "256Mi", Used: "256Mi", Hard: "256Mi", Over: "256Mi"}))
		Expect(quota.ExceededMessage("q1", over)).To(Equal(`sandbox quota "q1" exceeded: ` +
			"sandboxes: requested 1, used 1, limit 1 (1 over); " +
			"cpu: requested 1, used 1, limit 1 (1 over); " +
			"memory: requested 512Mi, used 512Mi, limit 512Mi (512Mi over); " +
			"disk: requested 256Mi, used 256Mi, limit 256Mi (256Mi over)"))
	})

	It("skips limits that fit and keeps the order of the others", func() {
		hard := sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](10), CPU: qp("500m"), Memory: qp("10Gi"), Disk: qp("100Mi")}
		over := quota.Exceeds(hard, quota.Zero(), req)
		Expect(over).To(HaveLen(2))
		Expect(over[0].Resource).To(Equal("cpu"))
		Expect(over[1].Resource).To(Equal("disk"))
		Expect(over[0].String()).To(Equal("cpu: requested 1, used 0, limit 500m (500m over)"))
		Expect(over[1].String()).To(Equal("disk: requested 256Mi, used 0, limit 100Mi (156Mi over)"))
	})

	It("does not change its arguments", func() {
		hard := sandboxv1alpha1.SandboxQuotaHard{CPU: qp("1")}
		used := usage(1, "1", "0", "0")
		quota.Exceeds(hard, used, req)
		Expect(hard.CPU.String()).To(Equal("1"))
		Expect(used.CPU.String()).To(Equal("1"))
		Expect(req.CPU.String()).To(Equal("1"))
	})
})

var _ = Describe("Violations", func() {
	newQuota := func(spec sandboxv1alpha1.SandboxQuotaSpec) *sandboxv1alpha1.SandboxQuota {
		return &sandboxv1alpha1.SandboxQuota{ObjectMeta: metav1.ObjectMeta{Name: "team", Namespace: "ns"}, Spec: spec}
	}
	newSandbox := func(image string) *sandboxv1alpha1.Sandbox {
		sbx := sandbox("a", "", "", "")
		sbx.Spec.Image = image
		return &sbx
	}

	It("allows anything when the quota has no rules", func() {
		sbx := newSandbox("anything/at:all")
		sbx.Spec.Runtime = sandboxv1alpha1.RuntimeGVisor
		sbx.Spec.Network.Mode = sandboxv1alpha1.NetworkNone
		Expect(quota.Violations(newQuota(sandboxv1alpha1.SandboxQuotaSpec{}), sbx)).To(BeEmpty())
	})

	It("allows every image when allowedImages is empty, even an invalid one", func() {
		Expect(quota.Violations(newQuota(sandboxv1alpha1.SandboxQuotaSpec{AllowedImages: []string{}}), newSandbox("Not A Ref"))).To(BeEmpty())
	})

	It("allows an image matching a pattern", func() {
		qt := newQuota(sandboxv1alpha1.SandboxQuotaSpec{AllowedImages: []string{"ghcr.io/acme/*", "docker.io/library/python:*"}})
		Expect(quota.Violations(qt, newSandbox("python:3.12"))).To(BeEmpty())
		Expect(quota.Violations(qt, newSandbox("ghcr.io/acme/tool:1"))).To(BeEmpty())
	})

	It("refuses an image no pattern matches, showing its normalized form", func() {
		qt := newQuota(sandboxv1alpha1.SandboxQuotaSpec{AllowedImages: []string{"ghcr.io/acme/*", "busybox:1"}})
		Expect(quota.Violations(qt, newSandbox("python:3.12"))).To(Equal([]string{
			`sandbox quota "team" does not allow image "python:3.12" (docker.io/library/python:3.12); allowed images: ghcr.io/acme/*, busybox:1`,
		}))
	})

	It("does not repeat an image that is already normalized", func() {
		qt := newQuota(sandboxv1alpha1.SandboxQuotaSpec{AllowedImages: []string{"busybox:1"}})
		Expect(quota.Violations(qt, newSandbox("docker.io/library/python:3"))).To(Equal([]string{
			`sandbox quota "team" does not allow image "docker.io/library/python:3"; allowed images: busybox:1`,
		}))
	})

	It("shows an unparseable image only as written", func() {
		qt := newQuota(sandboxv1alpha1.SandboxQuotaSpec{AllowedImages: []string{"docker.io/library/**"}})
		Expect(quota.Violations(qt, newSandbox("Python:3"))).To(Equal([]string{
			`sandbox quota "team" does not allow image "Python:3"; allowed images: docker.io/library/**`,
		}))
	})

	It("treats an empty runtime as runc", func() {
		qt := newQuota(sandboxv1alpha1.SandboxQuotaSpec{AllowedRuntimes: []sandboxv1alpha1.RuntimeClass{sandboxv1alpha1.RuntimeGVisor}})
		Expect(quota.Violations(qt, newSandbox("busybox"))).To(Equal([]string{
			`sandbox quota "team" does not allow runtime "runc"; allowed runtimes: gvisor`,
		}))
		allowRunc := newQuota(sandboxv1alpha1.SandboxQuotaSpec{AllowedRuntimes: []sandboxv1alpha1.RuntimeClass{sandboxv1alpha1.RuntimeRunc}})
		Expect(quota.Violations(allowRunc, newSandbox("busybox"))).To(BeEmpty())
	})

	It("refuses an explicit runtime that is not listed", func() {
		qt := newQuota(sandboxv1alpha1.SandboxQuotaSpec{AllowedRuntimes: []sandboxv1alpha1.RuntimeClass{sandboxv1alpha1.RuntimeRunc}})
		sbx := newSandbox("busybox")
		sbx.Spec.Runtime = sandboxv1alpha1.RuntimeGVisor
		Expect(quota.Violations(qt, sbx)).To(Equal([]string{
			`sandbox quota "team" does not allow runtime "gvisor"; allowed runtimes: runc`,
		}))
		both := newQuota(sandboxv1alpha1.SandboxQuotaSpec{AllowedRuntimes: []sandboxv1alpha1.RuntimeClass{sandboxv1alpha1.RuntimeRunc, sandboxv1alpha1.RuntimeGVisor}})
		Expect(quota.Violations(both, sbx)).To(BeEmpty())
	})

	It("refuses Egress unless allowEgress", func() {
		sbx := newSandbox("busybox")
		sbx.Spec.Network.Mode = sandboxv1alpha1.NetworkEgress
		Expect(quota.Violations(newQuota(sandboxv1alpha1.SandboxQuotaSpec{}), sbx)).To(Equal([]string{
			`sandbox quota "team" does not allow network mode Egress (its allowEgress is false); use network mode None`,
		}))
		Expect(quota.Violations(newQuota(sandboxv1alpha1.SandboxQuotaSpec{AllowEgress: true}), sbx)).To(BeEmpty())
	})

	It("allows no network and an unset mode without allowEgress", func() {
		for _, mode := range []sandboxv1alpha1.NetworkMode{"", sandboxv1alpha1.NetworkNone} {
			sbx := newSandbox("busybox")
			sbx.Spec.Network.Mode = mode
			Expect(quota.Violations(newQuota(sandboxv1alpha1.SandboxQuotaSpec{}), sbx)).To(BeEmpty(), "mode %q", mode)
		}
	})

	It("reports every broken rule, in the order image, runtime, egress, deadline", func() {
		qt := newQuota(sandboxv1alpha1.SandboxQuotaSpec{
			AllowedImages:            []string{"busybox:1"},
			AllowedRuntimes:          []sandboxv1alpha1.RuntimeClass{sandboxv1alpha1.RuntimeGVisor},
			MaxActiveDeadlineSeconds: ptr.To[int64](3600),
		})
		sbx := newSandbox("busybox:2")
		sbx.Spec.Network.Mode = sandboxv1alpha1.NetworkEgress
		sbx.Spec.ActiveDeadlineSeconds = ptr.To[int64](7200)
		Expect(quota.Violations(qt, sbx)).To(Equal([]string{
			`sandbox quota "team" does not allow image "busybox:2" (docker.io/library/busybox:2); allowed images: busybox:1`,
			`sandbox quota "team" does not allow runtime "runc"; allowed runtimes: gvisor`,
			`sandbox quota "team" does not allow network mode Egress (its allowEgress is false); use network mode None`,
			`sandbox quota "team" allows activeDeadlineSeconds of at most 3600; the Sandbox asks for 7200 (3600 over)`,
		}))
	})
})

var _ = Describe("DeadlineViolation", func() {
	withMax := func(max *int64) *sandboxv1alpha1.SandboxQuota {
		return &sandboxv1alpha1.SandboxQuota{ObjectMeta: metav1.ObjectMeta{Name: "team"},
			Spec: sandboxv1alpha1.SandboxQuotaSpec{MaxActiveDeadlineSeconds: max}}
	}

	It("allows anything when the quota sets no maximum", func() {
		Expect(quota.DeadlineViolation(withMax(nil), nil)).To(BeEmpty())
		Expect(quota.DeadlineViolation(withMax(nil), ptr.To[int64](2592000))).To(BeEmpty())
	})

	It("requires a deadline when the quota sets a maximum", func() {
		Expect(quota.DeadlineViolation(withMax(ptr.To[int64](600)), nil)).To(Equal(
			`sandbox quota "team" requires spec.activeDeadlineSeconds of at most 600; the Sandbox sets none`))
	})

	It("refuses a deadline over the maximum", func() {
		Expect(quota.DeadlineViolation(withMax(ptr.To[int64](600)), ptr.To[int64](601))).To(Equal(
			`sandbox quota "team" allows activeDeadlineSeconds of at most 600; the Sandbox asks for 601 (1 over)`))
	})

	It("allows a deadline equal to or below the maximum", func() {
		Expect(quota.DeadlineViolation(withMax(ptr.To[int64](600)), ptr.To[int64](600))).To(BeEmpty())
		Expect(quota.DeadlineViolation(withMax(ptr.To[int64](600)), ptr.To[int64](1))).To(BeEmpty())
	})
})

var _ = Describe("Count", func() {
	const timeout = time.Minute
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

	reservation := func(uid string, age time.Duration, u sandboxv1alpha1.SandboxQuotaUsage) sandboxv1alpha1.SandboxQuotaReservation {
		return sandboxv1alpha1.SandboxQuotaReservation{Name: "sbx-" + uid, UID: types.UID(uid), Time: metav1.NewTime(now.Add(-age)), Usage: u}
	}
	uids := func(rs []sandboxv1alpha1.SandboxQuotaReservation) []types.UID {
		out := []types.UID{}
		for _, r := range rs {
			out = append(out, r.UID)
		}
		return out
	}

	It("is zero, in canonical form, for an empty namespace", func() {
		r := quota.Count(nil, nil, nil, nil, nil, now, timeout)
		Expect(strs(r.Used)).To(Equal([]any{int64(0), "0", "0", "0"}))
		Expect(r.Reservations).To(BeEmpty())
		Expect(r.Overdue).To(BeEmpty())
		Expect(r.NextDeadline.IsZero()).To(BeTrue())
	})

	It("sums the Sandboxes that count and skips deleted and expired ones", func() {
		deleting := sandbox("d", "4", "4Gi", "4Gi")
		deleting.DeletionTimestamp = ptr.To(metav1.Now())
		sandboxes := []sandboxv1alpha1.Sandbox{
			sandbox("a", "500m", "256Mi", "128Mi"),
			sandbox("b", "", "", ""),
			deleting,
			expired(sandbox("e", "8", "8Gi", "8Gi"), metav1.ConditionTrue),
			expired(sandbox("f", "250m", "256Mi", "128Mi"), metav1.ConditionFalse),
		}
		r := quota.Count(nil, sandboxes, nil, nil, nil, now, timeout)
		Expect(strs(r.Used)).To(Equal([]any{int64(3), "1750m", "1Gi", "512Mi"}))
	})

	It("settles a reservation whose Sandbox is listed, without charging it twice", func() {
		res := []sandboxv1alpha1.SandboxQuotaReservation{reservation("a", time.Second, usage(1, "1", "512Mi", "256Mi"))}
		r := quota.Count(res, []sandboxv1alpha1.Sandbox{sandbox("a", "1", "512Mi", "256Mi")}, nil, nil, nil, now, timeout)
		Expect(strs(r.Used)).To(Equal([]any{int64(1), "1", "512Mi", "256Mi"}))
		Expect(r.Reservations).To(BeEmpty())
		Expect(r.Overdue).To(BeEmpty())
		Expect(r.NextDeadline.IsZero()).To(BeTrue())
	})

	It("settles a reservation whose Sandbox is listed but expired, charging nothing", func() {
		res := []sandboxv1alpha1.SandboxQuotaReservation{reservation("a", time.Second, usage(1, "1", "512Mi", "256Mi"))}
		r := quota.Count(res, []sandboxv1alpha1.Sandbox{expired(sandbox("a", "1", "512Mi", "256Mi"), metav1.ConditionTrue)}, nil, nil, nil, now, timeout)
		Expect(quota.Equal(r.Used, quota.Zero())).To(BeTrue())
		Expect(r.Reservations).To(BeEmpty())
	})

	It("settles a reservation whose Sandbox is reported deleted", func() {
		res := []sandboxv1alpha1.SandboxQuotaReservation{
			reservation("gone", time.Second, usage(1, "1", "512Mi", "256Mi")),
			reservation("pending", time.Second, usage(1, "2", "1Gi", "1Gi")),
		}
		var asked []types.UID
		deleted := func(uid types.UID) bool { asked = append(asked, uid); return uid == "gone" }
		r := quota.Count(res, nil, nil, nil, deleted, now, timeout)
		Expect(asked).To(ConsistOf(types.UID("gone"), types.UID("pending")))
		Expect(uids(r.Reservations)).To(Equal([]types.UID{"pending"}))
		Expect(strs(r.Used)).To(Equal([]any{int64(1), "2", "1Gi", "1Gi"}))
	})

	It("keeps and charges reservations before the timeout, in their order, with the earliest deadline", func() {
		res := []sandboxv1alpha1.SandboxQuotaReservation{
			reservation("young", 5*time.Second, usage(1, "1", "512Mi", "256Mi")),
			reservation("old", 50*time.Second, usage(1, "500m", "256Mi", "128Mi")),
			reservation("middle", 30*time.Second, usage(1, "250m", "256Mi", "128Mi")),
		}
		r := quota.Count(res, []sandboxv1alpha1.Sandbox{sandbox("x", "1", "1Gi", "1Gi")}, nil, nil, nil, now, timeout)
		Expect(uids(r.Reservations)).To(Equal([]types.UID{"young", "old", "middle"}))
		Expect(r.Overdue).To(BeEmpty())
		Expect(strs(r.Used)).To(Equal([]any{int64(4), "2750m", "2Gi", "1536Mi"}))
		Expect(r.NextDeadline).To(Equal(now.Add(10 * time.Second)))
	})

	It("marks reservations overdue at and after the timeout, without charging them", func() {
		res := []sandboxv1alpha1.SandboxQuotaReservation{
			reservation("late", 2*time.Minute, usage(1, "4", "4Gi", "4Gi")),
			reservation("fresh", 59*time.Second, usage(1, "1", "512Mi", "256Mi")),
			reservation("exact", timeout, usage(1, "2", "2Gi", "2Gi")),
		}
		r := quota.Count(res, nil, nil, nil, nil, now, timeout)
		Expect(uids(r.Overdue)).To(Equal([]types.UID{"late", "exact"}))
		Expect(uids(r.Reservations)).To(Equal([]types.UID{"fresh"}))
		Expect(strs(r.Used)).To(Equal([]any{int64(1), "1", "512Mi", "256Mi"}))
		Expect(r.NextDeadline).To(Equal(now.Add(time.Second)))
	})

	It("has no next deadline when everything is overdue", func() {
		res := []sandboxv1alpha1.SandboxQuotaReservation{reservation("late", time.Hour, usage(1, "1", "1Gi", "1Gi"))}
		r := quota.Count(res, nil, nil, nil, nil, now, timeout)
		Expect(r.NextDeadline.IsZero()).To(BeTrue())
		Expect(quota.Equal(r.Used, quota.Zero())).To(BeTrue())
	})

	It("settles a listed Sandbox's reservation even when it is overdue", func() {
		res := []sandboxv1alpha1.SandboxQuotaReservation{reservation("a", time.Hour, usage(1, "1", "512Mi", "256Mi"))}
		r := quota.Count(res, []sandboxv1alpha1.Sandbox{sandbox("a", "1", "512Mi", "256Mi")}, nil, nil, nil, now, timeout)
		Expect(r.Overdue).To(BeEmpty())
		Expect(r.Reservations).To(BeEmpty())
		Expect(r.Used.Sandboxes).To(Equal(int64(1)))
	})

	It("Keep adds an overdue reservation back, charged", func() {
		res := []sandboxv1alpha1.SandboxQuotaReservation{
			reservation("fresh", time.Second, usage(1, "1", "512Mi", "256Mi")),
			reservation("late", time.Hour, usage(1, "500m", "512Mi", "256Mi")),
		}
		r := quota.Count(res, nil, nil, nil, nil, now, timeout)
		Expect(uids(r.Overdue)).To(Equal([]types.UID{"late"}))
		r.Keep(r.Overdue[0])
		Expect(uids(r.Reservations)).To(Equal([]types.UID{"fresh", "late"}))
		Expect(strs(r.Used)).To(Equal([]any{int64(2), "1500m", "1Gi", "512Mi"}))
	})
})

var _ = Describe("Summary", func() {
	It("says there are no limits", func() {
		Expect(quota.Summary(sandboxv1alpha1.SandboxQuotaHard{}, usage(3, "3", "1Gi", "1Gi"))).To(Equal("sandboxes: 3 (no limits)"))
	})

	It("renders every limit in canonical form", func() {
		hard := sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](5), CPU: qp("4000m"), Memory: qp("4096Mi"), Disk: qp("2Gi")}
		Expect(quota.Summary(hard, usage(2, "1.5", "1024Mi", "512Mi"))).To(Equal("sandboxes: 2/5, cpu: 1500m/4, memory: 1Gi/4Gi, disk: 512Mi/2Gi"))
	})

	It("renders only the limits that are set", func() {
		Expect(quota.Summary(sandboxv1alpha1.SandboxQuotaHard{CPU: qp("2")}, usage(2, "1", "1Gi", "1Gi"))).To(Equal("cpu: 1/2"))
		Expect(quota.Summary(sandboxv1alpha1.SandboxQuotaHard{Disk: qp("1Gi")}, quota.Zero())).To(Equal("disk: 0/1Gi"))
	})
})

var _ = Describe("Exhaustion", func() {
	hard := sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](5), CPU: qp("4"), Memory: qp("4Gi"), Disk: qp("2Gi")}

	It("is within limits when every limit has room", func() {
		reason, msg := quota.Exhaustion(hard, usage(4, "3", "3Gi", "1Gi"))
		Expect(reason).To(Equal(sandboxv1alpha1.SandboxQuotaReasonWithinLimits))
		Expect(msg).To(Equal("every limit has room left"))
	})

	It("is within limits when there are no limits", func() {
		reason, _ := quota.Exhaustion(sandboxv1alpha1.SandboxQuotaHard{}, usage(100, "100", "100Gi", "100Gi"))
		Expect(reason).To(Equal(sandboxv1alpha1.SandboxQuotaReasonWithinLimits))
	})

	It("reports a limit reached exactly, however it is spelt", func() {
		reason, msg := quota.Exhaustion(hard, usage(1, "4000m", "1Gi", "1Gi"))
		Expect(reason).To(Equal(sandboxv1alpha1.SandboxQuotaReasonLimitReached))
		Expect(msg).To(Equal("fully used: cpu 4 of 4"))
	})

	It("lists every full limit in order", func() {
		reason, msg := quota.Exhaustion(hard, usage(5, "1", "4Gi", "2Gi"))
		Expect(reason).To(Equal(sandboxv1alpha1.SandboxQuotaReasonLimitReached))
		Expect(msg).To(Equal("fully used: sandboxes 5 of 5, memory 4Gi of 4Gi, disk 2Gi of 2Gi"))
	})

	It("reports over the limit ahead of full ones and names only those over", func() {
		reason, msg := quota.Exhaustion(hard, usage(7, "4", "5Gi", "1Gi"))
		Expect(reason).To(Equal(sandboxv1alpha1.SandboxQuotaReasonOverLimit))
		Expect(msg).To(Equal("over the limit (lowered below what already runs; new Sandboxes are refused until usage drops): " +
			"sandboxes 7 used of 5, memory 5Gi used of 4Gi"))
	})

	It("reports a single limit over, even by the smallest amount", func() {
		reason, msg := quota.Exhaustion(hard, usage(1, "4001m", "1Gi", "1Gi"))
		Expect(reason).To(Equal(sandboxv1alpha1.SandboxQuotaReasonOverLimit))
		Expect(msg).To(Equal("over the limit (lowered below what already runs; new Sandboxes are refused until usage drops): cpu 4001m used of 4"))
	})

	It("treats a zero limit with zero usage as reached", func() {
		reason, msg := quota.Exhaustion(sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](0)}, quota.Zero())
		Expect(reason).To(Equal(sandboxv1alpha1.SandboxQuotaReasonLimitReached))
		Expect(msg).To(Equal("fully used: sandboxes 0 of 0"))
	})
})
