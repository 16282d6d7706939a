/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package quota_test

import (
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
		Expect(quota.SnapshotCountExceeded(q, quota.SnapshotUsage{Count: 1000})).To(BeEmpty())
		Expect(quota.SnapshotBytesExceeded(q, quota.SnapshotUsage{Bytes: 1 << 40}, 1<<40)).To(BeEmpty())
		q.Spec.Hard.Snapshots = ptr.To[int64](2)
		q.Spec.Hard.SnapshotBytes = ptr.To(resource.MustParse("1Ki"))
		Expect(quota.SnapshotCountExceeded(q, quota.SnapshotUsage{Count: 1})).To(BeEmpty())
		Expect(quota.SnapshotCountExceeded(q, quota.SnapshotUsage{Count: 2})).To(Equal(`sandbox quota "q": snapshots: 2 of 2 used, 1 more requested`))
		Expect(quota.SnapshotBytesExceeded(q, quota.SnapshotUsage{Bytes: 1000}, 24)).To(BeEmpty())
		Expect(quota.SnapshotBytesExceeded(q, quota.SnapshotUsage{Bytes: 1000}, 25)).To(Equal(`sandbox quota "q": snapshotBytes: 1000 of 1024 bytes used, 25 more requested`))
	})
})
