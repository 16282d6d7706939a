/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxwarmpool

import (
	"k8s.io/apimachinery/pkg/api/meta"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// view is a pool's members as one reconcile sees them.
type view struct {
	hash     string
	template sandboxv1alpha1.SandboxTemplate
	// active are the members that count toward spec.replicas: not
	// deleting, not claimed, not broken.
	active []*sandboxv1alpha1.Sandbox
	// pending are members this controller created that the cache does not
	// show yet; they count as active, unbound and not idle.
	pending []pendingCreate
}

func (v *view) count() int { return len(v.active) + len(v.pending) }

// fresh: made from the current template. The label is what the member
// says; the spec is what its container was made from, and a member whose
// spec is not the template's is never claimed (warmpool.Matches), so it is
// replaced like a stale one. This controller's cache holds no command or
// env (controllers.CacheOptions), so the rest of the shape is compared
// here; the claiming manager compares the whole spec.
func (v *view) fresh(sbx *sandboxv1alpha1.Sandbox) bool {
	return sbx.Labels[sandboxv1alpha1.LabelTemplateHash] == v.hash && warmpool.MatchesStripped(&sbx.Spec, v.template)
}

func (v *view) stale() int {
	n := 0
	for _, s := range v.active {
		if !v.fresh(s) {
			n++
		}
	}
	for _, p := range v.pending {
		if p.hash != v.hash {
			n++
		}
	}
	return n
}

func (v *view) ready() int {
	n := 0
	for _, s := range v.active {
		if v.fresh(s) && warmpool.Idle(s) {
			n++
		}
	}
	return n
}

func (v *view) remove(sbx *sandboxv1alpha1.Sandbox) {
	for i, s := range v.active {
		if s.UID == sbx.UID {
			v.active = append(v.active[:i], v.active[i+1:]...)
			return
		}
	}
}

func readyReason(sbx *sandboxv1alpha1.Sandbox) (reason, msg string) {
	c := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
	if c == nil {
		return "", ""
	}
	return c.Reason, c.Message
}

func nodeOf(sbx *sandboxv1alpha1.Sandbox) string {
	if sbx.Status.NodeName == "" {
		return "(none)"
	}
	return sbx.Status.NodeName
}
