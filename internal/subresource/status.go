/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package subresource

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Every refusal of the node API, the aggregated API server and the
// SandboxQuota webhook is a metav1.Status whose reason is one of
// apimachinery's standard ones (NotFound, Forbidden, Conflict, …), so
// apierrors.ReasonForError and the apierrors.Is* helpers work on it. Its
// details name the Sandbox (StatusGroup, StatusKind, the Sandbox's name) and,
// where the reason alone is too coarse, details.causes[].type says exactly
// why with one of the Cause constants below. A client must treat a cause it
// does not know as absent, and decide by the reason.
const (
	// StatusGroup and StatusKind are details.group and details.kind: the
	// Sandbox resource the failure is about.
	StatusGroup = "sandbox.code-sandbox.dev"
	StatusKind  = "sandboxes"
	// StatusKindWarmPool is details.kind of the SandboxQuota webhook's
	// refusals of a SandboxWarmPool.
	StatusKindWarmPool = "sandboxwarmpools"
)

// Causes (details.causes[].type), each with the reason it comes with.
const (
	// CauseSandboxNotReady (Conflict): the Sandbox exists but its Ready
	// condition is not True, or no node has claimed it yet.
	CauseSandboxNotReady metav1.CauseType = "SandboxNotReady"
	// CauseSandboxTerminating (Conflict): the Sandbox is being deleted.
	CauseSandboxTerminating metav1.CauseType = "SandboxTerminating"
	// CauseSandboxPaused (Conflict): the Sandbox is paused (spec.paused is
	// true, or its container is frozen); set spec.paused to false to resume
	// it.
	CauseSandboxPaused metav1.CauseType = "SandboxPaused"
	// CauseWarmPoolMember (Conflict): the Sandbox is an idle member of a
	// SandboxWarmPool. Members are never used directly, so that a claimed
	// member is as clean as a fresh sandbox; claim it with a Sandbox whose
	// spec.warmPoolRef names the pool.
	CauseWarmPoolMember metav1.CauseType = "WarmPoolMember"
	// CauseContainerNotRunning (Conflict): the Sandbox's container is gone
	// or stopped, or is not the Sandbox's own; the manager repairs it
	// or reports the Sandbox not Ready.
	CauseContainerNotRunning metav1.CauseType = "ContainerNotRunning"
	// CauseSandboxNotOnNode (NotFound, node API only): the Sandbox is not
	// bound to the node that was asked.
	CauseSandboxNotOnNode metav1.CauseType = "SandboxNotOnNode"
	// CausePathNotFound (NotFound): the path inside the Sandbox does not
	// exist; the Sandbox itself does.
	CausePathNotFound metav1.CauseType = "PathNotFound"
	// CauseInvalidPath (BadRequest): the path is not one the Sandbox may
	// use (outside the allowed roots, "..", …). The cause's field is
	// "path".
	CauseInvalidPath metav1.CauseType = "InvalidPath"
	// CauseNoSuchEndpoint (NotFound): the URL names no subresource of this
	// API; nothing is said about the Sandbox.
	CauseNoSuchEndpoint metav1.CauseType = "NoSuchEndpoint"
	// CauseExecLimit (TooManyRequests): the Sandbox, or its node, already
	// runs as many commands and transfers as it allows; retry after
	// details.retryAfterSeconds.
	CauseExecLimit metav1.CauseType = "ExecLimit"
	// CauseFollowLimit (TooManyRequests): the Sandbox, or its node, already
	// serves as many followed log and history streams (follow=true) as it
	// allows; close a follower, read without follow, or retry after
	// details.retryAfterSeconds.
	CauseFollowLimit metav1.CauseType = "FollowLimit"
	// CauseProcessNotFound (NotFound): no background process has the
	// handle in this Sandbox (never started here, another Sandbox's, or
	// dropped as the oldest finished one). The cause's field is "handle".
	CauseProcessNotFound metav1.CauseType = "ProcessNotFound"
	// CauseProcessLimit (TooManyRequests): the Sandbox already runs
	// execio.MaxProcesses background processes; kill one or wait for one
	// to end.
	CauseProcessLimit metav1.CauseType = "ProcessLimit"
	// CauseProcessExited (Conflict): the background process has exited or
	// closed its stdin, so its stdin takes no more writes.
	CauseProcessExited metav1.CauseType = "ProcessExited"
	// CauseRuntimeUnavailable (ServiceUnavailable): the node's Docker
	// Engine does not answer.
	CauseRuntimeUnavailable metav1.CauseType = "RuntimeUnavailable"
	// CauseNodeAPIUnavailable (ServiceUnavailable, aggregated API server):
	// the Sandbox's node has not published its node API, or it does not
	// answer.
	CauseNodeAPIUnavailable metav1.CauseType = "NodeAPIUnavailable"
	// CauseStreamFailed (the reason says why: ServiceUnavailable, Timeout,
	// InternalError): the terminal Status of an exec stream, or of a
	// download or log stream, that failed after its response began.
	CauseStreamFailed metav1.CauseType = "StreamFailed"

	// CauseQuotaExceeded (Forbidden, SandboxQuota webhook): the Sandbox does
	// not fit in a SandboxQuota's remaining room. The cause's field is the
	// quota's name.
	CauseQuotaExceeded metav1.CauseType = "QuotaExceeded"
	// CauseQuotaRule (Forbidden, SandboxQuota webhook): a rule of a
	// SandboxQuota (allowed images or runtimes, egress, lifetime) refuses
	// the Sandbox as asked; another spec may be admitted. The cause's field
	// is the refused spec field, e.g. spec.image.
	CauseQuotaRule metav1.CauseType = "QuotaRule"
	// CauseQuotaNotCounted (Forbidden, SandboxQuota webhook): the quota has
	// not counted its usage yet; retry in a few seconds.
	CauseQuotaNotCounted metav1.CauseType = "QuotaNotCounted"
	// CauseWarmPoolNotFound (Forbidden, SandboxQuota webhook): the Sandbox
	// claims from a SandboxWarmPool (spec.warmPoolRef, the cause's field)
	// that does not exist, so what it would run cannot be checked against
	// the namespace's quotas. Create the pool first.
	CauseWarmPoolNotFound metav1.CauseType = "WarmPoolNotFound"
	// CauseWarmPoolMembership (Forbidden, SandboxQuota webhook): a create
	// by anyone but the warm pool controller carries warm pool membership
	// (the warm-pool or template-hash label, or an ownerReference to a
	// SandboxWarmPool), or an update would make a Sandbox a warm pool
	// member or move it to another pool. Only the pool creates members,
	// and membership is fixed at creation, because a member must never
	// have been used.
	CauseWarmPoolMembership metav1.CauseType = "WarmPoolMembership"
	// CauseSnapshotClaim (Forbidden, SandboxSnapshot webhook, details.kind
	// sandboxsnapshots): a status update would set status.node (the
	// cause's field) to a node other than the one the source Sandbox runs
	// on, or the one the request's token is bound to, or would change it
	// once set. Only the source's node's manager claims a snapshot.
	CauseSnapshotClaim metav1.CauseType = "SnapshotClaim"
)

// HasCause reports whether st carries a cause of type t.
func HasCause(st *metav1.Status, t metav1.CauseType) bool {
	if st == nil || st.Details == nil {
		return false
	}
	for _, c := range st.Details.Causes {
		if c.Type == t {
			return true
		}
	}
	return false
}

// FailureStatus is the Status of a failure about the Sandbox name (may be
// empty), with optional causes.
func FailureStatus(code int32, reason metav1.StatusReason, name, message string, causes ...metav1.StatusCause) *metav1.Status {
	return &metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Code:     code,
		Reason:   reason,
		Message:  message,
		Details:  &metav1.StatusDetails{Name: name, Group: StatusGroup, Kind: StatusKind, Causes: causes},
	}
}
