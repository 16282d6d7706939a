/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// The warm pool member's side of the node reconciler: what a Sandbox is to
// the warm pools, decided once per reconcile (poolRoleOf), and what only a
// member goes through: the health check before its freeze, a container
// that is never recreated in place, and the hand-over of its container to
// a claimant. The claimant's side is warmclaim.go.

// poolRoleKind is what a Sandbox is to the warm pools.
type poolRoleKind int

const (
	// plainSandbox is neither a pool's member nor a claimant: the
	// ordinary path, with no warm pool step.
	plainSandbox poolRoleKind = iota
	// poolMember is a pool's member (warmpool.PoolOf) that nobody claimed.
	poolMember
	// memberBeingClaimed is a member that this manager reserved for a
	// claim not yet written.
	memberBeingClaimed
	// claimedMember is a member whose container a claimant took over, or
	// that recorded such a claim: its container is the claimant's.
	claimedMember
	// poolClaimant has spec.warmPoolRef: it runs in the container of the
	// member its status names (Sandbox.ContainerUID), once claimed. The
	// CRD keeps it apart from members: spec.image and spec.warmPoolRef
	// exclude each other, and a member has its template's image.
	poolClaimant
)

// poolRole is a Sandbox's poolRoleKind and, for a claimed member, its
// claimant.
type poolRole struct {
	kind poolRoleKind
	// claimant took over a claimedMember's container; claimantKnown is
	// false when only the member's own status still records the claim.
	claimant      types.NamespacedName
	claimantKnown bool
}

// poolRoleOf classifies sbx once per reconcile. Whether some Sandbox
// claimed sbx's container is asked of every Sandbox, not only of those
// that carry a pool's marks: the marks can be removed (the garbage
// collector orphaning a pool's members), and a container handed to a
// claimant must stay the claimant's whatever its first owner looks like
// now.
func (r *SandboxReconciler) poolRoleOf(ctx context.Context, sbx *sandboxv1alpha1.Sandbox) (poolRole, error) {
	if _, committed, reserved := r.members.get(sbx.UID); reserved && !committed {
		return poolRole{kind: memberBeingClaimed}, nil
	}
	claimant, claimed, err := r.claimantOf(ctx, sbx.UID)
	if err != nil {
		return poolRole{}, err
	}
	if claimed || wasClaimed(sbx) {
		return poolRole{kind: claimedMember, claimant: claimant, claimantKnown: claimed}, nil
	}
	switch {
	case warmpool.PoolOf(sbx) != "":
		return poolRole{kind: poolMember}, nil
	case sbx.Spec.WarmPoolRef != nil, sbx.ContainerUID() != sbx.UID:
		// A claimant, or a fork that took over a member (restore.go).
		return poolRole{kind: poolClaimant}, nil
	}
	return poolRole{kind: plainSandbox}, nil
}

// memberContainerMissing reports a member whose container disappeared. A
// member is never recreated in place: the pool controller replaces it
// with a fresh one.
func (r *SandboxReconciler) memberContainerMissing(sbx *sandboxv1alpha1.Sandbox) ctrl.Result {
	r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonContainerMissing,
		fmt.Sprintf("container %s disappeared; the warm pool replaces this member", dockerruntime.ShortID(sbx.Status.ContainerID)))
	return ctrl.Result{}
}

// checkMemberBeforeFreeze runs a member's health check before it is
// frozen, so that a claim never gets a container no command can run in.
// Unless healthy, the caller returns result and err.
func (r *SandboxReconciler) checkMemberBeforeFreeze(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, ct dockerruntime.Container, requeueAfter time.Duration) (result ctrl.Result, healthy bool, err error) {
	if err := r.docker.CheckHealth(ctx, ct.ID); err != nil {
		result, err := r.memberUnhealthy(ctx, sbx, ct, err, requeueAfter)
		return result, false, err
	}
	return ctrl.Result{}, true, nil
}

// memberUnhealthy reports a warm pool member whose health check failed and
// checks it again after a backoff; it stays unfrozen and unclaimable
// meanwhile. The pool keeps it and reports MembersFailing: a replacement
// made from the same template would most likely fail the same way.
func (r *SandboxReconciler) memberUnhealthy(ctx context.Context, sbx *sandboxv1alpha1.Sandbox, ct dockerruntime.Container, err error, untilExpiry time.Duration) (ctrl.Result, error) {
	if errors.Is(err, dockerruntime.ErrUnavailable) || errors.Is(err, dockerruntime.ErrNotFound) {
		// Docker could not run it: not the member's fault.
		return r.dockerFailure(ctx, sbx, err)
	}
	sbx.Status.ContainerID = ct.ID
	if sbx.Status.StartTime == nil {
		// The lifetime counts from the first start, healthy or not, so
		// that a member failing its check for good still expires and is
		// replaced where a quota demands a lifetime.
		start := metav1.NewTime(r.clock.Now())
		sbx.Status.StartTime = &start
	}
	r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonHealthCheckFailed, err.Error())
	delay := r.backoff.next(sbx.UID)
	if untilExpiry > 0 && untilExpiry < delay {
		delay = untilExpiry
	}
	logf.FromContext(ctx).Info("warm pool member failed its health check; checking again", "after", delay, "error", err.Error())
	return ctrl.Result{RequeueAfter: delay}, nil
}

// settleClaimedMember handles a member whose container a claimant took
// over: it records that, and leaves the container alone (it is the
// claimant's now). The pool controller deletes the member. A member that
// was once claimed stays claimed even when its claimant is gone: its
// container may hold that claimant's work and must never be handed out
// again.
func (r *SandboxReconciler) settleClaimedMember(sbx *sandboxv1alpha1.Sandbox, claimant types.NamespacedName, known bool) ctrl.Result {
	msg := fmt.Sprintf("its container %s was handed to sandbox %s", dockerruntime.ShortID(sbx.Status.ContainerID), claimant.Name)
	if !known {
		if c := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady)); c != nil {
			msg = c.Message
		}
	}
	r.setReady(sbx, metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonClaimed, msg)
	return ctrl.Result{}
}

// wasClaimed reports whether the member recorded a claim of its container.
func wasClaimed(sbx *sandboxv1alpha1.Sandbox) bool {
	c := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
	return c != nil && c.Reason == sandboxv1alpha1.SandboxReasonClaimed && warmpool.PoolOf(sbx) != ""
}
