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

var _ = Describe("Snapshot counting", Label("unit"), func() {
	snap := func(uid, reason string, ready bool, size int64, deleting bool) sandboxv1alpha1.SandboxSnapshot {
		s := sandboxv1alpha1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid)}}
		if reason != "" {
			st := metav1.ConditionFalse
			if ready {
				st = metav1.ConditionTrue
			}
			s.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: st, Reason: reason}}
		}
		s.Status.SizeBytes = size
		if deleting {
			now := metav1.Now()
			s.DeletionTimestamp = &now
		}
		return s
	}

	It("counts pending and stored snapshots, and the bytes of stored ones only", func() {
		snaps := []sandboxv1alpha1.SandboxSnapshot{
			snap("a", "", false, 0, false),
			snap("b", sandboxv1alpha1.SnapshotReasonStored, true, 100, false),
			snap("c", sandboxv1alpha1.SnapshotReasonPending, false, 999, false),
			snap("d", sandboxv1alpha1.SnapshotReasonTooLarge, false, 0, false),
			snap("e", sandboxv1alpha1.SnapshotReasonSourceGone, false, 0, false),
			snap("f", sandboxv1alpha1.SnapshotReasonQuotaExceeded, false, 50, false),
			snap("g", sandboxv1alpha1.SnapshotReasonStored, true, 7, true),
			snap("h", sandboxv1alpha1.SnapshotReasonStored, true, 1000, false),
		}
		Expect(quota.CountSnapshots(snaps, "")).To(Equal(quota.SnapshotUsage{Count: 4, Bytes: 1100}))
		Expect(quota.CountSnapshots(snaps, "h")).To(Equal(quota.SnapshotUsage{Count: 3, Bytes: 100}))
	})

	It("says which cap a snapshot exceeds, and nothing without a cap", func() {
		q := &sandboxv1alpha1.SandboxQuota{ObjectMeta: metav1.ObjectMeta{Name: "q"}}
		Expect(quota.SnapshotBytesExceeded(q, quota.SnapshotUsage{Bytes: 1 << 40}, 1<<40)).To(BeEmpty())
		q.Spec.Hard.Snapshots = ptr.To[int64](2)
		q.Spec.Hard.SnapshotBytes = ptr.To(resource.MustParse("1Ki"))
		Expect(quota.SnapshotBytesExceeded(q, quota.SnapshotUsage{Bytes: 1000}, 24)).To(BeEmpty())
		Expect(quota.SnapshotBytesExceeded(q, quota.SnapshotUsage{Bytes: 1000}, 25)).To(Equal(`sandbox quota "q": snapshotBytes: 1000 of 1024 bytes used, 25 more requested`))
	})

	It("checks a snapshot request against the snapshot limits only, and a Sandbox against the Sandbox limits only", func() {
		hard := sandboxv1alpha1.SandboxQuotaHard{
			Sandboxes: ptr.To[int64](1), Snapshots: ptr.To[int64](2), SnapshotBytes: ptr.To(resource.MustParse("1Ki")),
		}
		used := quota.Zero()
		used.Sandboxes = 5 // over a lowered Sandbox limit
		used.Snapshots = 1
		used.SnapshotBytes = ptr.To(resource.MustParse("1000"))
		Expect(quota.Exceeds(hard, used, quota.SnapshotRequest())).To(BeEmpty())
		used.Snapshots = 2
		over := quota.Exceeds(hard, used, quota.SnapshotRequest())
		Expect(quota.ExceededMessage("q", over)).To(Equal(`sandbox quota "q" exceeded: snapshots: requested 1, used 2, limit 2 (1 over)`))
		// At the bytes cap nothing fits: every stored snapshot has bytes.
		used.Snapshots = 0
		used.SnapshotBytes = ptr.To(resource.MustParse("1Ki"))
		over = quota.Exceeds(hard, used, quota.SnapshotRequest())
		Expect(quota.ExceededMessage("q", over)).To(Equal(`sandbox quota "q" exceeded: snapshotBytes: requested a new snapshot, used 1Ki, limit 1Ki (no bytes left for its files)`))
		// A Sandbox is not refused for snapshots over their limits.
		used.Sandboxes = 0
		used.Snapshots = 100
		Expect(quota.Exceeds(hard, used, quota.Usage(&sandboxv1alpha1.Sandbox{}))).To(BeEmpty())
	})

	It("counts snapshots and their stored bytes into usage, and settles a snapshot's reservation once it is listed", func() {
		now := time.Now()
		res := []sandboxv1alpha1.SandboxQuotaReservation{
			{Kind: sandboxv1alpha1.ReservationKindSnapshot, Name: "b", UID: "b", Time: metav1.NewTime(now), Usage: quota.SnapshotRequest()},
			{Kind: sandboxv1alpha1.ReservationKindSnapshot, Name: "new", UID: "new", Time: metav1.NewTime(now), Usage: quota.SnapshotRequest()},
		}
		snaps := []sandboxv1alpha1.SandboxSnapshot{
			snap("b", sandboxv1alpha1.SnapshotReasonStored, true, 100, false),
			snap("c", sandboxv1alpha1.SnapshotReasonPending, false, 0, false),
			snap("d", sandboxv1alpha1.SnapshotReasonTooLarge, false, 0, false),
		}
		r := quota.Count(res, nil, snaps, nil, nil, now, time.Minute)
		Expect(r.Used.Snapshots).To(Equal(int64(3)), "b and c, and the reservation of new")
		Expect(quota.SnapshotBytes(r.Used)).To(Equal(int64(100)))
		Expect(r.Reservations).To(HaveLen(1))
		Expect(r.Reservations[0].Name).To(Equal("new"))
		Expect(quota.Summary(sandboxv1alpha1.SandboxQuotaHard{Snapshots: ptr.To[int64](4), SnapshotBytes: ptr.To(resource.MustParse("1Mi"))}, r.Used)).
			To(Equal("snapshots: 3/4, snapshotBytes: 100/1Mi"))
		reason, msg := quota.Exhaustion(sandboxv1alpha1.SandboxQuotaHard{Snapshots: ptr.To[int64](3)}, r.Used)
		Expect(reason).To(Equal(sandboxv1alpha1.SandboxQuotaReasonLimitReached))
		Expect(msg).To(ContainSubstring("snapshots 3 of 3"))
		// Taking the reservation back leaves no bytes field behind.
		Expect(quota.Equal(quota.Sub(quota.SnapshotRequest(), quota.SnapshotRequest()), quota.Zero())).To(BeTrue())
		Expect(quota.Sub(quota.SnapshotRequest(), quota.SnapshotRequest()).SnapshotBytes).To(BeNil())
	})
})
