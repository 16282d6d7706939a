/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package subresource

import (
	"context"
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// CheckReady is the one answer to "can this Sandbox take commands and file
// transfers?", from the Sandbox alone: nil, or a Conflict whose cause says
// why not:
//   - CauseSandboxTerminating: it is being deleted (whatever else is true
//     of it, as it cannot leave that state);
//   - CauseSandboxNotReady: no node has claimed it, or its Ready condition
//     is missing or not True (the message gives the condition's reason and
//     message);
//   - CauseWarmPoolMember: it is an idle member of a SandboxWarmPool, which
//     is never used directly, so that a claimed member is as clean as a
//     fresh sandbox;
//   - CauseSandboxPaused: its Ready condition's reason is Paused.
//
// The aggregated API server, the node API, sandboxclient (from a Sandbox
// its caller already read) and the tests' fake API server all decide with
// it. The node API then checks the container itself.
func CheckReady(sbx *sandboxv1alpha1.Sandbox) *Error {
	key := sbx.Namespace + "/" + sbx.Name
	if !sbx.DeletionTimestamp.IsZero() {
		return Conflict(CauseSandboxTerminating, "sandbox %s is not Ready: it is being deleted", key)
	}
	if sbx.Status.NodeName == "" {
		return notClaimed(key)
	}
	if pool := warmpool.PoolOf(sbx); pool != "" {
		return Conflict(CauseWarmPoolMember,
			"sandbox %s is a member of warm pool %s and is not used directly; create a Sandbox with spec.warmPoolRef.name %s to claim one",
			key, pool, pool)
	}
	ready := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
	switch {
	case ready == nil:
		return Conflict(CauseSandboxNotReady, "sandbox %s is not Ready: no manager has reported on it yet", key)
	case ready.Status == metav1.ConditionTrue:
		return nil
	case ready.Reason == sandboxv1alpha1.SandboxReasonPaused:
		return Conflict(CauseSandboxPaused, "sandbox %s is paused: %s", key, ready.Message)
	}
	return Conflict(CauseSandboxNotReady, "sandbox %s is not Ready: %s: %s", key, ready.Reason, ready.Message)
}

// CheckServed is what the aggregated API server requires of a Sandbox
// before it forwards the subresource sub to its node: a node has claimed
// it, it is Ready for exec and files (CheckReady; logs and history are
// served for a Sandbox that is not, to show why it died), and its node has
// published its node API (else a ServiceUnavailable with the cause
// CauseNodeAPIUnavailable).
func CheckServed(sbx *sandboxv1alpha1.Sandbox, sub string) *Error {
	key := sbx.Namespace + "/" + sbx.Name
	if NeedsReady(sub) {
		if err := CheckReady(sbx); err != nil {
			return err
		}
	} else if sbx.Status.NodeName == "" {
		return notClaimed(key)
	}
	if sbx.Status.NodeAPIEndpoint == "" {
		return NewError(http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
			"sandbox %s: node %s has not published its node API", key, sbx.Status.NodeName).Because(CauseNodeAPIUnavailable, "")
	}
	return nil
}

func notClaimed(key string) *Error {
	return Conflict(CauseSandboxNotReady, "sandbox %s is not Ready: no node has claimed it yet", key)
}

// GetFunc reads the Sandbox key into sbx, failing with apimachinery's
// NotFound when there is none: a controller-runtime client.Reader's Get.
// (A function rather than client.Reader keeps controller-runtime's client
// out of this package, which clients link.)
type GetFunc func(ctx context.Context, key types.NamespacedName, sbx *sandboxv1alpha1.Sandbox) error

// GetSandbox reads a Sandbox from cache, or from apiReader (when not nil)
// if the cache has not caught up with it yet. A missing Sandbox is a
// NotFound *Error.
func GetSandbox(ctx context.Context, cache, apiReader GetFunc, key types.NamespacedName) (*sandboxv1alpha1.Sandbox, error) {
	sbx := &sandboxv1alpha1.Sandbox{}
	err := cache(ctx, key, sbx)
	if apierrors.IsNotFound(err) && apiReader != nil {
		err = apiReader(ctx, key, sbx)
	}
	switch {
	case apierrors.IsNotFound(err):
		return nil, NewError(http.StatusNotFound, metav1.StatusReasonNotFound, "sandbox %s not found", key)
	case err != nil:
		return nil, fmt.Errorf("reading sandbox %s: %w", key, err)
	}
	return sbx, nil
}

// FreshIfNotReady returns sbx, or the API server's copy of it when the
// cached sbx is not Ready: a cache can lag a status its caller has already
// seen (an MCP server that resumed a Sandbox and watched it become Ready),
// so a refusal for not being Ready is only made on the API server's word.
func FreshIfNotReady(ctx context.Context, apiReader GetFunc, sbx *sandboxv1alpha1.Sandbox) *sandboxv1alpha1.Sandbox {
	if apiReader == nil || meta.IsStatusConditionTrue(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady)) {
		return sbx
	}
	fresh := &sandboxv1alpha1.Sandbox{}
	if err := apiReader(ctx, types.NamespacedName{Namespace: sbx.Namespace, Name: sbx.Name}, fresh); err != nil || fresh.UID != sbx.UID {
		return sbx
	}
	return fresh
}
