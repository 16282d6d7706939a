/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package warmpool

import (
	"sort"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/quota"
)

// RoomyMember picks the newest idle member of pool whose removal makes
// room for usage in every quota, or returns nil. used says what each quota
// has used (its status, or a fresh count). The newest goes because the
// managers hand out the oldest to claimants. The admission webhook uses it
// to decide whether a claimant at a full quota fits once a member goes;
// the pool controller then evicts in the same order (IdleMembers).
func RoomyMember(quotas []sandboxv1alpha1.SandboxQuota, used func(*sandboxv1alpha1.SandboxQuota) sandboxv1alpha1.SandboxQuotaUsage,
	sandboxes []sandboxv1alpha1.Sandbox, pools Templates, pool *sandboxv1alpha1.SandboxWarmPool,
	usage sandboxv1alpha1.SandboxQuotaUsage) *sandboxv1alpha1.Sandbox {
	members := IdleMembers(sandboxes, pool)
	for _, m := range members {
		frees := quota.Usage(Charged(m, pools))
		fits := true
		for i := range quotas {
			q := &quotas[i]
			if q.Status.ObservedGeneration == 0 || len(quota.Exceeds(q.Spec.Hard, quota.Sub(used(q), frees), usage)) > 0 {
				fits = false
				break
			}
		}
		if fits {
			return m
		}
	}
	return nil
}

// IdleMembers are pool's idle members that count toward a quota and that
// no claimant took, newest first: the order in which they give way to a
// claim.
func IdleMembers(sandboxes []sandboxv1alpha1.Sandbox, pool *sandboxv1alpha1.SandboxWarmPool) []*sandboxv1alpha1.Sandbox {
	claimed := quota.ClaimedMembers(sandboxes)
	var members []*sandboxv1alpha1.Sandbox
	for i := range sandboxes {
		m := &sandboxes[i]
		// A member that does not count frees nothing when deleted.
		if IsMemberOf(m, pool) && Idle(m) && quota.Counts(m) && !claimed[m.UID] {
			members = append(members, m)
		}
	}
	sort.Slice(members, func(i, j int) bool {
		a, b := members[i].CreationTimestamp, members[j].CreationTimestamp
		if !a.Equal(&b) {
			return b.Before(&a)
		}
		return members[i].Name > members[j].Name
	})
	return members
}
