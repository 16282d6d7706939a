/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// memberClaimField indexes Sandboxes by the UID of the warm pool member
// whose container they took over (status.warmPool.member.uid).
const memberClaimField = "status.warmPool.member.uid"

// coldClaimGrace is how long a manager without an idle member of the pool
// leaves a new claim to managers that may have one, before it creates the
// container from the template itself.
const coldClaimGrace = 300 * time.Millisecond

// memberClaims remembers which claimant took which member's container:
// reserved while the claim is being made (the container thawed, the claim
// not yet written), committed once the claim's status write succeeded and
// until the cache shows it; the cache index (memberClaimField) answers for
// everything older, including across restarts.
type memberClaims struct {
	mu    sync.Mutex
	taken map[types.UID]memberClaim
	// firstSeen is when this manager first looked at an unbound claimant
	// (CreationTimestamp has a resolution of a second, too coarse for the
	// cold-claim grace).
	firstSeen map[types.UID]time.Time
}

type memberClaim struct {
	claimant  types.NamespacedName
	committed bool
}

func newMemberClaims() *memberClaims {
	return &memberClaims{taken: map[types.UID]memberClaim{}, firstSeen: map[types.UID]time.Time{}}
}

func (m *memberClaims) reserve(member types.UID, claimant types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.taken[member] = memberClaim{claimant: claimant}
}

func (m *memberClaims) commit(member types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, ok := m.taken[member]; ok {
		c.committed = true
		m.taken[member] = c
	}
}

func (m *memberClaims) release(member types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.taken, member)
}

// releaseClaimant forgets the member a vanished claimant took over, so that
// the member's deletion removes the container.
func (m *memberClaims) releaseClaimant(claimant types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for member, c := range m.taken {
		if c.claimant == claimant {
			delete(m.taken, member)
		}
	}
}

// get returns the claimant of a member, and whether the claim is committed.
func (m *memberClaims) get(member types.UID) (key types.NamespacedName, committed, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.taken[member]
	return c.claimant, c.committed, ok
}

// seen returns how long ago this manager first looked at claimant uid.
func (m *memberClaims) seen(uid types.UID, now time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	first, ok := m.firstSeen[uid]
	if !ok {
		m.firstSeen[uid] = now
		return 0
	}
	return now.Sub(first)
}

func (m *memberClaims) forgetSeen(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.firstSeen, uid)
}

// claimantOf returns the Sandbox that took over the container of the member
// with this UID, if any. A member's container belongs to its claimant from
// the claim on: the member's own finalizer, expiry and the orphan collector
// must leave it alone. When the answer is unknown (err), callers keep the
// container and retry.
func (r *SandboxReconciler) claimantOf(ctx context.Context, member types.UID) (types.NamespacedName, bool, error) {
	if member == "" {
		return types.NamespacedName{}, false, nil
	}
	if key, _, ok := r.members.get(member); ok {
		return key, true, nil
	}
	var list sandboxv1alpha1.SandboxList
	if err := r.client.List(ctx, &list, client.MatchingFields{memberClaimField: string(member)}); err != nil {
		return types.NamespacedName{}, false, fmt.Errorf("looking up the claimant of warm pool member %s: %w", member, err)
	}
	for i := range list.Items {
		if list.Items[i].Status.NodeName == r.opts.NodeName {
			return client.ObjectKeyFromObject(&list.Items[i]), true, nil
		}
	}
	return types.NamespacedName{}, false, nil
}

// claimFromPool binds an unbound Sandbox with spec.warmPoolRef to this node.
// With an idle member of the pool on this node, the claim records the
// member in the Sandbox's status (one status write, guarded by the
// resourceVersion like every claim) and the reconcile that follows thaws the
// member's container for it. Members are bound to one node, so the local
// lock is enough to hand each one to one Sandbox. Without an idle member
// here, the claim is left briefly to nodes that may have one, then taken
// cold: the container is created from the pool's template.
func (r *SandboxReconciler) claimFromPool(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) (bool, ctrl.Result, error) {
	log := logf.FromContext(ctx)
	pool := &sandboxv1alpha1.SandboxWarmPool{}
	if err := r.client.Get(ctx, types.NamespacedName{Namespace: sbx.Namespace, Name: sbx.Spec.WarmPoolRef.Name}, pool); err != nil {
		if !apierrors.IsNotFound(err) {
			return false, ctrl.Result{}, err
		}
		cond := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
		if cond == nil || cond.Reason != sandboxv1alpha1.SandboxReasonWarmPoolNotFound {
			r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonWarmPoolNotFound,
				fmt.Sprintf("SandboxWarmPool %q does not exist in namespace %s; waiting for it", sbx.Spec.WarmPoolRef.Name, sbx.Namespace))
			if err := r.client.Status().Update(ctx, sbx); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				return false, ctrl.Result{}, err
			}
		}
		return false, ctrl.Result{RequeueAfter: 2 * time.Second}, nil
	}
	if !pool.DeletionTimestamp.IsZero() {
		// A pool being deleted has no controller looking after it (its
		// members are the garbage collector's), and anyone who can add a
		// finalizer can hold it there while changing its template and
		// members unchecked: nothing is claimed from it, warm or cold.
		cond := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
		msg := fmt.Sprintf("SandboxWarmPool %q in namespace %s is being deleted; nothing is claimed from it", pool.Name, sbx.Namespace)
		if cond == nil || cond.Reason != sandboxv1alpha1.SandboxReasonWarmPoolNotFound || cond.Message != msg {
			r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonWarmPoolNotFound, msg)
			if err := r.client.Status().Update(ctx, sbx); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				return false, ctrl.Result{}, err
			}
		}
		return false, ctrl.Result{RequeueAfter: 2 * time.Second}, nil
	}
	hash := warmpool.Hash(pool.Spec.Template)
	template := pool.Spec.Template.DeepCopy()
	record := func(s *sandboxv1alpha1.Sandbox, member *sandboxv1alpha1.Sandbox) metav1.Condition {
		s.Status.WarmPool = &sandboxv1alpha1.SandboxWarmPoolClaimStatus{TemplateHash: hash, Template: template}
		claim := metav1.Condition{Type: string(sandboxv1alpha1.SandboxConditionWarmPoolClaim), ObservedGeneration: s.Generation,
			Status: metav1.ConditionFalse, Reason: sandboxv1alpha1.SandboxReasonWarmPoolEmpty,
			Message: fmt.Sprintf("warm pool %s had no idle member; creating the container from its template", pool.Name)}
		if member != nil {
			s.Status.WarmPool.Member = &sandboxv1alpha1.WarmPoolMemberReference{Name: member.Name, UID: member.UID}
			s.Status.ContainerID = member.Status.ContainerID
			claim.Status, claim.Reason = metav1.ConditionTrue, sandboxv1alpha1.SandboxReasonWarmPoolClaimed
			claim.Message = fmt.Sprintf("took over idle member %s of warm pool %s", member.Name, pool.Name)
		}
		meta.SetStatusCondition(&s.Status.Conditions, claim)
		return claim
	}

	r.claims.mu.Lock()
	member, elsewhere, err := r.idleMember(ctx, pool, hash)
	if err != nil || member == nil {
		r.claims.mu.Unlock()
		if err != nil {
			return false, ctrl.Result{}, err
		}
		// Another node holds an idle member; give it the first moment.
		if elsewhere > 0 && sbx.Spec.NodeName == "" && r.members.seen(sbx.UID, r.clock.Now()) < coldClaimGrace {
			return false, ctrl.Result{RequeueAfter: coldClaimGrace / 3}, nil
		}
		r.members.forgetSeen(sbx.UID)
		var claim metav1.Condition
		claimed, result, err := r.claimNode(ctx, sbx, func(s *sandboxv1alpha1.Sandbox) { claim = record(s, nil) })
		if !claimed || err != nil {
			return false, result, err
		}
		warmClaims.WithLabelValues("cold").Inc()
		log.Info("claimed sandbox cold: its warm pool has no idle member here", "pool", pool.Name)
		r.recorder.Eventf(sbx, nil, "Normal", claim.Reason, "Claim", "%s (node %s)", claim.Message, r.opts.NodeName)
		// A cold claim yields its worker, so that a burst of claims is
		// bound (and the warm members handed out) before the slow creates
		// begin.
		return false, ctrl.Result{RequeueAfter: time.Millisecond}, nil
	}
	return r.takeMember(ctx, sbx, pool, member, record, true)
}

// takeMember hands member, an idle member of pool on this node that
// idleMember picked, to sbx: reserved, the claim written (record fills it
// in), the container thawed. With ready, the claim write is also Ready (a
// plain warm claim); without (a fork, whose files are restored first), Ready
// stays False until the claimant's reconcile has restored them. Caller holds
// r.claims.mu, which takeMember releases.
func (r *SandboxReconciler) takeMember(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, pool *sandboxv1alpha1.SandboxWarmPool, member *sandboxv1alpha1.Sandbox,
	record func(s, member *sandboxv1alpha1.Sandbox) metav1.Condition, ready bool) (bool, ctrl.Result, error) {
	log := logf.FromContext(ctx)
	// Reserved before the lock goes: no other claim on this node can take
	// it, and the member's own reconcile leaves its container alone.
	key := client.ObjectKeyFromObject(sbx)
	r.members.reserve(member.UID, key)
	r.members.forgetSeen(sbx.UID)
	r.claims.mu.Unlock()

	// The claim and Ready are one status write, made while Docker thaws the
	// container: the node API's exec and file transfers on it wait for the
	// thaw (dockerruntime.BeginUnpause), so Ready is true for every
	// operation that reaches it, and the claim costs the longer of the two
	// rather than their sum. A lost claim freezes the member again.
	release := func() {
		r.members.release(member.UID)
		if err := r.docker.Pause(context.WithoutCancel(ctx), member.Status.ContainerID); err != nil {
			log.Error(err, "re-freezing a warm pool member after a lost claim; the pool replaces it", "member", member.Name)
		}
		r.enqueue(member.Namespace, member.Name, member.UID)
	}
	claimStart := r.clock.Now()
	thawed := r.docker.BeginUnpause(member.Status.ContainerID)
	// A warm claim needs no capacity: the member already holds its place on
	// this node, and stops counting once claimed (usedCapacity).
	r.startClaim(sbx) // sec-unbound2: a claim starts from an empty status
	sbx.Status.ObservedGeneration = sbx.Generation
	claim := record(sbx, member)
	if ready {
		r.markRunning(sbx, member.Status.ContainerID, 0)
	} else {
		r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonProvisioning,
			claim.Message+"; restoring the snapshot's files before Ready")
	}
	if err := r.client.Status().Update(ctx, sbx); err != nil {
		_ = thawed(context.WithoutCancel(ctx))
		release()
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return false, ctrl.Result{}, nil
		}
		return false, ctrl.Result{}, fmt.Errorf("claiming sandbox: %w", err)
	}
	thawErr := thawed(ctx)
	warmClaimLatency.Observe(r.clock.Since(claimStart).Seconds())
	r.members.commit(member.UID)
	r.claims.mu.Lock()
	r.claims.claimed[key] = sbx.UID
	r.claims.mu.Unlock()
	warmClaims.WithLabelValues("warm").Inc()
	log.Info("claimed sandbox from warm pool", "pool", pool.Name, "member", member.Name)
	r.recorder.Eventf(sbx, nil, "Normal", claim.Reason, "Claim", "%s (node %s)", claim.Message, r.opts.NodeName)
	// The member's own reconcile records that it was claimed.
	r.enqueue(member.Namespace, member.Name, member.UID)
	if thawErr != nil {
		// Claimed, but still frozen: the claimant's reconcile thaws a
		// container frozen against spec.paused (settlePaused), and records
		// the failure if Docker keeps refusing.
		return true, ctrl.Result{}, fmt.Errorf("thawing warm pool member %s for its claimant: %w", member.Name, thawErr)
	}
	return true, ctrl.Result{}, nil
}

// idleMember picks the oldest idle member of pool whose spec is the current
// template's (warmpool.Matches), on this node, that no Sandbox has
// claimed. Caller holds r.claims.mu.
func (r *SandboxReconciler) idleMember(ctx context.Context, pool *sandboxv1alpha1.SandboxWarmPool, hash string) (mine *sandboxv1alpha1.Sandbox, elsewhere int, err error) {
	var list sandboxv1alpha1.SandboxList
	if err := r.client.List(ctx, &list, client.InNamespace(pool.Namespace),
		client.MatchingLabels{sandboxv1alpha1.LabelWarmPool: pool.Name, sandboxv1alpha1.LabelTemplateHash: hash}); err != nil {
		return nil, 0, fmt.Errorf("listing the members of warm pool %s: %w", pool.Name, err)
	}
	sort.Slice(list.Items, func(i, j int) bool {
		return list.Items[i].CreationTimestamp.Before(&list.Items[j].CreationTimestamp)
	})
	for i := range list.Items {
		m := &list.Items[i]
		// The labels only narrow the list: the spec (what the container
		// was made from) must be the template's, so that a Sandbox that
		// merely carries a pool's labels and ownerReference is never
		// handed to a claimant as the template's container.
		if !warmpool.IsMemberOf(m, pool) || !warmpool.Idle(m) {
			continue
		}
		if m.Status.NodeName != r.opts.NodeName {
			// Another node's member comes from the cache without its
			// command (CacheOptions); it only delays a cold claim.
			if warmpool.MatchesStripped(&m.Spec, pool.Spec.Template) {
				elsewhere++
			}
			continue
		}
		if !warmpool.Matches(&m.Spec, pool.Spec.Template) {
			continue
		}
		if mine != nil {
			continue
		}
		if _, taken, err := r.claimantOf(ctx, m.UID); err != nil {
			return nil, 0, err
		} else if taken {
			continue
		}
		mine = m
	}
	return mine, elsewhere, nil
}
