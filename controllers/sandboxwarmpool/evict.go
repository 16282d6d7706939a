/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxwarmpool

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/quota"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// evictForClaimants makes room for the pool's claimants at a full quota.
// The admission webhook admits a claimant that fits only once an idle
// member of its pool is gone and charges it on top of that member
// (internal/admission makeRoom), but deletes nothing, because an
// AdmissionReview is no proof that the claimant was stored. This
// controller evicts instead, from what the API server holds: while a quota
// of the namespace is over its limit and claimants of pool exist that hold
// no member, it deletes idle members, newest first (the managers hand out
// the oldest), at most one per such claimant. A claimant that a manager
// serves with a member in the meantime frees its own room (a claimed
// member no longer counts), and then nothing is evicted for it.
func (r *Reconciler) evictForClaimants(ctx context.Context, key types.NamespacedName, pool *sandboxv1alpha1.SandboxWarmPool,
	sandboxes []sandboxv1alpha1.Sandbox, v *view, deleting map[types.UID]bool, now time.Time) ([]note, error) {
	waiting := 0
	for i := range sandboxes {
		sbx := &sandboxes[i]
		if ref := sbx.Spec.WarmPoolRef; ref != nil && ref.Name == pool.Name && claimedUID(sbx) == "" &&
			warmpool.PoolOf(sbx) == "" && quota.Counts(sbx) && !deleting[sbx.UID] {
			waiting++
		}
	}
	if waiting == 0 {
		return nil, nil
	}
	var quotas sandboxv1alpha1.SandboxQuotaList
	if err := r.client.List(ctx, &quotas, client.InNamespace(pool.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the SandboxQuotas in namespace %s: %w", pool.Namespace, err)
	}
	if len(quotas.Items) == 0 {
		return nil, nil
	}
	var pools sandboxv1alpha1.SandboxWarmPoolList
	if err := r.client.List(ctx, &pools, client.InNamespace(pool.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the SandboxWarmPools in namespace %s: %w", pool.Namespace, err)
	}
	templates := warmpool.TemplatesOf(pools.Items)
	charged := func(sbx *sandboxv1alpha1.Sandbox) *sandboxv1alpha1.Sandbox { return warmpool.Charged(sbx, templates) }

	// What is left once this controller's own deletes land.
	live := make([]sandboxv1alpha1.Sandbox, 0, len(sandboxes))
	for i := range sandboxes {
		if !deleting[sandboxes[i].UID] {
			live = append(live, sandboxes[i])
		}
	}
	over := func() bool {
		for i := range quotas.Items {
			q := &quotas.Items[i]
			if q.Status.ObservedGeneration == 0 {
				continue
			}
			// As the webhook counts: every reservation still recorded is
			// a create that may be on its way.
			count := quota.Count(q.Status.Reservations, live, nil, charged, nil, now, 0)
			for _, res := range count.Overdue {
				count.Keep(res)
			}
			if len(quota.Exceeds(q.Spec.Hard, count.Used, quota.Zero())) > 0 {
				return true
			}
		}
		return false
	}

	var notes []note
	for evicted := 0; evicted < waiting && over(); evicted++ {
		idle := warmpool.IdleMembers(live, pool)
		if len(idle) == 0 {
			break
		}
		m := idle[0].DeepCopy()
		// The decision was made from the cache: the resourceVersion
		// precondition makes sure the member is still the idle one seen
		// (a manager may have handed it to a claimant meanwhile).
		uid, rv := m.UID, m.ResourceVersion
		err := r.client.Delete(ctx, m, client.Preconditions{UID: &uid, ResourceVersion: &rv})
		switch {
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			// Its change requeues the pool; decide again then.
			return notes, nil
		case err != nil:
			return notes, fmt.Errorf("evicting warm pool member %s/%s: %w", m.Namespace, m.Name, err)
		}
		r.mu.Lock()
		r.state(key).deletes[uid] = now
		r.mu.Unlock()
		v.remove(m)
		for i := range live {
			if live[i].UID == m.UID {
				live = append(live[:i], live[i+1:]...)
				break
			}
		}
		notes = append(notes, note{eventType: "Normal", reason: "MemberEvicted", action: "Delete", related: m,
			msg: fmt.Sprintf("deleted idle member %s to make room in the namespace's sandbox quota for a claimant of the pool", m.Name)})
	}
	return notes, nil
}
