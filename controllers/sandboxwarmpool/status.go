/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxwarmpool

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

func (r *Reconciler) setReady(pool *sandboxv1alpha1.SandboxWarmPool, v *view, want int, createFailure string, failing []string) {
	status, reason := metav1.ConditionFalse, sandboxv1alpha1.SandboxWarmPoolReasonFilling
	msg := fmt.Sprintf("%d of %d members idle", v.ready(), want)
	sort.Strings(failing)
	if len(failing) > maxFailingNamed {
		failing = append(failing[:maxFailingNamed], fmt.Sprintf("and %d more", len(failing)-maxFailingNamed))
	}
	switch stale := v.stale(); {
	case createFailure != "":
		reason = sandboxv1alpha1.SandboxWarmPoolReasonMembersFailing
		msg = "creating members: " + createFailure
		if len(failing) > 0 {
			msg += "; " + strings.Join(failing, "; ")
		}
	case len(failing) > 0:
		reason = sandboxv1alpha1.SandboxWarmPoolReasonMembersFailing
		msg = strings.Join(failing, "; ")
	case v.ready() == v.count() && v.count() == want:
		status, reason = metav1.ConditionTrue, sandboxv1alpha1.SandboxWarmPoolReasonFilled
		msg = fmt.Sprintf("%d of %d members idle", v.ready(), want)
	case stale > 0:
		reason = sandboxv1alpha1.SandboxWarmPoolReasonRollingOut
		msg = fmt.Sprintf("%d of %d members were made from an older template; %d of %d idle", stale, v.count(), v.ready(), want)
	}
	meta.SetStatusCondition(&pool.Status.Conditions, metav1.Condition{
		Type:               string(sandboxv1alpha1.SandboxWarmPoolConditionReady),
		Status:             status,
		Reason:             reason,
		Message:            msg,
		ObservedGeneration: pool.Generation,
		LastTransitionTime: metav1.NewTime(r.clock.Now()),
	})
}
