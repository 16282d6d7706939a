/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package quota

import (
	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// ClaimedMembers returns the UIDs of the warm pool members whose container
// another Sandbox took over, as the managers recorded it in the claimants'
// status. Such a member does not count: its container is its claimant's,
// and the claimant counts. Only status decides, because only the managers
// write it; labels and ownerReferences are the namespace user's to write,
// and must never make a Sandbox free.
func ClaimedMembers(sandboxes []sandboxv1alpha1.Sandbox) map[types.UID]bool {
	out := map[types.UID]bool{}
	for i := range sandboxes {
		wp := sandboxes[i].Status.WarmPool
		// As for Sandbox.ContainerUID, a member counts only for a Sandbox
		// with spec.warmPoolRef or spec.snapshotRef: no other Sandbox ever
		// takes one over.
		if wp == nil || wp.Member == nil || wp.Member.UID == "" || wp.Member.UID == sandboxes[i].UID || sandboxes[i].ContainerUID() == sandboxes[i].UID {
			continue
		}
		out[wp.Member.UID] = true
	}
	return out
}
