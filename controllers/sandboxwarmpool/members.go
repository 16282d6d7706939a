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
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// poolState is what one pool's reconciles remember between them.
type poolState struct {
	// creates and deletes are this controller's own writes that the cache
	// has not shown yet. Without them a reconcile that runs before the
	// cache catches up would create members twice, or delete a second
	// stale member on a node whose first replacement it cannot see.
	creates map[types.UID]pendingCreate
	deletes map[types.UID]time.Time

	// Creates refused in a row, the last refusal, and when to try again.
	failures    int
	lastFailure string
	retryAt     time.Time
}

type pendingCreate struct {
	hash string
	at   time.Time
}

// createMembers creates up to n members, stopping at the first refusal:
// the next would be refused the same way. After a refusal it does not try
// again before the backoff ends, however often the pool is requeued.
func (r *Reconciler) createMembers(ctx context.Context, key types.NamespacedName, pool *sandboxv1alpha1.SandboxWarmPool,
	v *view, n int, now time.Time) (created int, failure string, retryAt time.Time) {
	r.mu.Lock()
	st := r.state(key)
	if now.Before(st.retryAt) {
		failure, retryAt = st.lastFailure, st.retryAt
		r.mu.Unlock()
		return 0, failure, retryAt
	}
	r.mu.Unlock()

	lifetime, err := r.memberLifetime(ctx, pool.Namespace)
	if err != nil {
		return 0, err.Error(), now.Add(r.backoff(1))
	}
	for range n {
		sbx := warmpool.Member(pool)
		sbx.Spec.ActiveDeadlineSeconds = lifetime
		if err := r.client.Create(ctx, sbx); err != nil {
			logf.FromContext(ctx).Info("creating a warm pool member failed", "pool", key, "error", err.Error())
			r.mu.Lock()
			defer r.mu.Unlock()
			st.failures++
			st.lastFailure = err.Error()
			st.retryAt = now.Add(r.backoff(st.failures))
			return created, st.lastFailure, st.retryAt
		}
		created++
		p := pendingCreate{hash: v.hash, at: now}
		v.pending = append(v.pending, p)
		r.mu.Lock()
		st.creates[sbx.UID] = p
		r.mu.Unlock()
	}
	r.clearFailures(key)
	return created, "", time.Time{}
}

// memberLifetime is the activeDeadlineSeconds new members get: none, or
// where the namespace's SandboxQuotas demand a lifetime
// (maxActiveDeadlineSeconds), the shortest they allow. A member that reaches
// it expires and is replaced, so idle members are recycled rather than
// refused; a claimant's own lifetime counts from its claim.
func (r *Reconciler) memberLifetime(ctx context.Context, namespace string) (*int64, error) {
	var quotas sandboxv1alpha1.SandboxQuotaList
	if err := r.client.List(ctx, &quotas, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("listing the SandboxQuotas of namespace %s: %w", namespace, err)
	}
	var lifetime *int64
	for i := range quotas.Items {
		if max := quotas.Items[i].Spec.MaxActiveDeadlineSeconds; max != nil && (lifetime == nil || *max < *lifetime) {
			lifetime = ptr.To(*max)
		}
	}
	return lifetime, nil
}

func (r *Reconciler) backoff(failures int) time.Duration {
	d := createBackoffBase
	for i := 1; i < failures && d < r.opts.CreateBackoffMax; i++ {
		d *= 2
	}
	return min(d, r.opts.CreateBackoffMax)
}

func (r *Reconciler) clearFailures(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.state(key)
	st.failures, st.lastFailure, st.retryAt = 0, "", time.Time{}
}

// deleteMember deletes a member, only the very object that was looked at.
func (r *Reconciler) deleteMember(ctx context.Context, key types.NamespacedName, sbx *sandboxv1alpha1.Sandbox, now time.Time) error {
	uid := sbx.UID
	err := r.client.Delete(ctx, sbx, client.Preconditions{UID: &uid})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting warm pool member %s/%s: %w", sbx.Namespace, sbx.Name, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.state(key).deletes[uid] = now
	return nil
}

// observe settles the pool's expectations against what the cache shows and
// returns the creates it does not show yet and the deletes it still shows
// as live.
func (r *Reconciler) observe(key types.NamespacedName, sandboxes []sandboxv1alpha1.Sandbox, now time.Time) ([]pendingCreate, map[types.UID]bool) {
	live := make(map[types.UID]bool, len(sandboxes))
	for i := range sandboxes {
		live[sandboxes[i].UID] = sandboxes[i].DeletionTimestamp.IsZero()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.state(key)
	var pending []pendingCreate
	for uid, p := range st.creates {
		if _, seen := live[uid]; seen || now.Sub(p.at) > expectationTTL {
			delete(st.creates, uid)
			continue
		}
		pending = append(pending, p)
	}
	deleting := map[types.UID]bool{}
	for uid, at := range st.deletes {
		if !live[uid] || now.Sub(at) > expectationTTL {
			delete(st.deletes, uid)
			continue
		}
		deleting[uid] = true
	}
	return pending, deleting
}

// state returns key's state, creating it; r.mu must be held.
func (r *Reconciler) state(key types.NamespacedName) *poolState {
	st := r.pools[key]
	if st == nil {
		st = &poolState{creates: map[types.UID]pendingCreate{}, deletes: map[types.UID]time.Time{}}
		r.pools[key] = st
	}
	return st
}

func (r *Reconciler) forget(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pools, key)
}
