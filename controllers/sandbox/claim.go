/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// eventGeneric asks for a reconcile of one Sandbox from outside the API
// server: a Docker event, or a resync after the event stream reconnects.
type eventGeneric = event.TypedGenericEvent[*sandboxv1alpha1.Sandbox]

// claimTracker remembers the Sandboxes this manager has claimed but its cache
// may not show yet, so that capacity is never overcommitted by a stale cache.
// Entries are keyed by name so that a Sandbox that vanished (NotFound, UID
// unknown) can still be released.
type claimTracker struct {
	mu      sync.Mutex
	claimed map[types.NamespacedName]types.UID
}

func newClaimTracker() *claimTracker {
	return &claimTracker{claimed: map[types.NamespacedName]types.UID{}}
}

func (t *claimTracker) release(key types.NamespacedName) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.claimed, key)
}

// relevant filters the watch down to Sandboxes this node may act on: bound to
// it, or unbound and not pinned to another node.
func (r *SandboxReconciler) relevant() predicate.Predicate {
	return predicate.NewPredicateFuncs(func(obj client.Object) bool {
		sbx, ok := obj.(*sandboxv1alpha1.Sandbox)
		if !ok {
			return false
		}
		return r.mayHandle(sbx)
	})
}

func (r *SandboxReconciler) mayHandle(sbx *sandboxv1alpha1.Sandbox) bool {
	if sbx.Status.NodeName != "" {
		return sbx.Status.NodeName == r.opts.NodeName
	}
	return sbx.Spec.NodeName == "" || sbx.Spec.NodeName == r.opts.NodeName
}

// claim binds an unbound Sandbox to this node by writing status.nodeName with
// the resourceVersion it read: if another manager claimed it first, the
// write conflicts and this manager backs off. Capacity is checked under a
// lock, counting both the cache and claims the cache has not caught up with.
func (r *SandboxReconciler) claim(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) (bool, ctrl.Result, error) {
	if !r.mayHandle(sbx) {
		return false, ctrl.Result{}, nil
	}
	if sbx.Spec.WarmPoolRef != nil {
		return r.claimFromPool(ctx, sbx)
	}
	if sbx.Spec.SnapshotRef != nil {
		return r.claimRestore(ctx, sbx)
	}
	if wait := r.spreadWait(ctx, sbx); wait > 0 {
		return false, ctrl.Result{RequeueAfter: wait}, nil
	}
	return r.claimNode(ctx, sbx, nil)
}

// claimNode is the claim of a Sandbox that needs a new container; record,
// when set, adds to the status the claim writes.
func (r *SandboxReconciler) claimNode(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, record func(*sandboxv1alpha1.Sandbox)) (bool, ctrl.Result, error) {
	log := logf.FromContext(ctx)
	r.claims.mu.Lock()
	defer r.claims.mu.Unlock()

	used, err := r.usedCapacity(ctx)
	if err != nil {
		return false, ctrl.Result{}, err
	}
	if used >= r.opts.MaxSandboxes {
		// Leave it to a node with room. Recheck later in case this node frees
		// up, with jitter so that full managers do not poll in lockstep.
		retry := 5*time.Second + rand.N(5*time.Second)
		cond := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
		report := ""
		switch {
		case sbx.Spec.NodeName == r.opts.NodeName && (cond == nil || cond.Reason != sandboxv1alpha1.SandboxReasonNodeAtCapacity):
			report = sandboxv1alpha1.SandboxReasonNodeAtCapacity
			r.setReady(sbx, metav1.ConditionFalse, report,
				fmt.Sprintf("node %s is running its maximum of %d sandboxes", r.opts.NodeName, r.opts.MaxSandboxes))
		case sbx.Spec.NodeName == "" && cond == nil:
			// Say once why nothing happens yet; another node may still claim
			// it a moment later, which simply overwrites this.
			report = sandboxv1alpha1.SandboxReasonPending
			r.setReady(sbx, metav1.ConditionFalse, report,
				fmt.Sprintf("waiting for a node with spare capacity (node %s is full)", r.opts.NodeName))
		}
		if report != "" {
			// A conflict means someone else wrote first, likely a claim.
			if err := r.client.Status().Update(ctx, sbx); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				return false, ctrl.Result{}, fmt.Errorf("reporting %s: %w", report, err)
			}
		}
		log.V(1).Info("node at capacity; leaving sandbox to others", "used", used)
		return false, ctrl.Result{RequeueAfter: retry}, nil
	}

	r.startClaim(sbx)
	if record != nil {
		record(sbx)
	}
	r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonProvisioning, "claimed by node "+r.opts.NodeName)
	if err := r.client.Status().Update(ctx, sbx); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			// Someone else won, or it is gone; the next event tells.
			return false, ctrl.Result{}, nil
		}
		return false, ctrl.Result{}, fmt.Errorf("claiming sandbox: %w", err)
	}
	r.claims.claimed[client.ObjectKeyFromObject(sbx)] = sbx.UID
	r.spread.forget(sbx.UID)
	log.Info("claimed sandbox")
	r.recorder.Eventf(sbx, nil, "Normal", "Claimed", "Claim", "claimed by node %s", r.opts.NodeName)
	return true, ctrl.Result{}, nil
}

// startClaim binds sbx to this node, starting from an empty status. Every
// manager may write the pending conditions of an unbound Sandbox
// (config/policy/sandbox_status_policy.yaml), so nothing written before the
// claim is trusted: a compromised manager of another node could otherwise
// plant a container ID, a warm pool member (another Sandbox's container, to
// be adopted here) or a start time (which moves the deadline).
func (r *SandboxReconciler) startClaim(sbx *sandboxv1alpha1.Sandbox) {
	sbx.Status = sandboxv1alpha1.SandboxStatus{NodeName: r.opts.NodeName}
}

// usedCapacity counts live Sandboxes bound to this node. Caller holds
// r.claims.mu.
func (r *SandboxReconciler) usedCapacity(ctx context.Context) (int, error) {
	var list sandboxv1alpha1.SandboxList
	if err := r.client.List(ctx, &list, client.MatchingFields{statusNodeNameField: r.opts.NodeName}); err != nil {
		return 0, fmt.Errorf("listing sandboxes on node: %w", err)
	}
	counted := make(map[types.UID]struct{}, len(list.Items)+len(r.claims.claimed))
	handedOver := map[types.UID]bool{}
	for i := range list.Items {
		if m := list.Items[i].Status.WarmPool; m != nil && m.Member != nil {
			handedOver[m.Member.UID] = true
		}
	}
	for i := range list.Items {
		sbx := &list.Items[i]
		if meta.IsStatusConditionTrue(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionExpired)) || sbx.IsNodeLost() {
			continue
		}
		// A claimed member's container is its claimant's: count it once.
		if _, _, claimed := r.members.get(sbx.UID); claimed || handedOver[sbx.UID] {
			continue
		}
		counted[sbx.UID] = struct{}{}
	}
	for _, uid := range r.claims.claimed {
		counted[uid] = struct{}{}
	}
	return len(counted), nil
}

// backoffTracker spaces out retries per Sandbox: recreating a container
// that keeps disappearing, or pulling an image that is not there.
type backoffTracker struct {
	mu    sync.Mutex
	clock interface{ Now() time.Time }
	base  time.Duration
	max   time.Duration
	state map[types.UID]backoffState
}

type backoffState struct {
	attempts  int
	notBefore time.Time
}

func newBackoffTracker(clk interface{ Now() time.Time }, base, max time.Duration) *backoffTracker {
	return &backoffTracker{clock: clk, base: base, max: max, state: map[types.UID]backoffState{}}
}

// next records a failure and returns how long to wait before trying again.
func (b *backoffTracker) next(uid types.UID) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.state[uid]
	delay := b.base << min(st.attempts, 20)
	if delay > b.max || delay <= 0 {
		delay = b.max
	}
	st.attempts++
	st.notBefore = b.clock.Now().Add(delay)
	b.state[uid] = st
	return delay
}

// remaining is how long until the next attempt is allowed.
func (b *backoffTracker) remaining(uid types.UID) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	st, ok := b.state[uid]
	if !ok {
		return 0
	}
	return max(st.notBefore.Sub(b.clock.Now()), 0)
}

func (b *backoffTracker) reset(uid types.UID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.state, uid)
}
