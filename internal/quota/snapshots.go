/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package quota

import (
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// SnapshotUsage is what a namespace's SandboxSnapshots take from its
// quotas: how many count, and the bytes of those stored. The quota
// controller (status.used, through Count) and the node managers (bytes,
// once a size is known) count with this one function.
//
// It reads only what the operator writes: status.conditions and
// status.sizeBytes are written only by the manager of the node holding the
// snapshot (config/policy/snapshot_status_policy.yaml), and the deletion
// timestamp, which a user may set, only frees what the user gives up.
type SnapshotUsage struct {
	Count int64
	Bytes int64
}

// CountSnapshots counts snaps, leaving out the one with UID except (empty:
// none), those being deleted and those that failed for good.
func CountSnapshots(snaps []sandboxv1alpha1.SandboxSnapshot, except types.UID) SnapshotUsage {
	var u SnapshotUsage
	for i := range snaps {
		s := &snaps[i]
		if s.UID == except || !s.DeletionTimestamp.IsZero() || s.IsFailed() {
			continue
		}
		u.Count++
		if s.IsReady() {
			u.Bytes += s.Status.SizeBytes
		}
	}
	return u
}

// SnapshotBytesExceeded says why a snapshot of size bytes does not fit q
// next to used, or "".
func SnapshotBytesExceeded(q *sandboxv1alpha1.SandboxQuota, used SnapshotUsage, size int64) string {
	if h := q.Spec.Hard.SnapshotBytes; h != nil && used.Bytes+size > h.Value() {
		return fmt.Sprintf("sandbox quota %q: snapshotBytes: %d of %d bytes used, %d more requested", q.Name, used.Bytes, h.Value(), size)
	}
	return ""
}
