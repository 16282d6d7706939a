/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package testenv

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// ReadyTimeout bounds the wait for a new Sandbox to become Ready: an image
// pull or a busy shared machine can take this long; it is not a speed
// assertion.
const ReadyTimeout = 90 * time.Second

// ReadyReason returns a poll of the Sandbox key's Ready condition as
// "Status/Reason" (for example "True/Running"): "" while it has none, and
// "error: …" when the Sandbox cannot be read (for example, it is gone), so a
// failed Eventually shows what was seen.
func ReadyReason(c client.Reader, key client.ObjectKey) func() string {
	return func() string {
		sbx := &sandboxv1alpha1.Sandbox{}
		if err := c.Get(context.Background(), key, sbx); err != nil {
			return "error: " + err.Error()
		}
		cond := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
		if cond == nil {
			return ""
		}
		return string(cond.Status) + "/" + cond.Reason
	}
}

// WaitReady waits until sbx is Ready with reason Running and returns the
// Sandbox as read then.
func WaitReady(c client.Reader, sbx *sandboxv1alpha1.Sandbox) *sandboxv1alpha1.Sandbox {
	GinkgoHelper()
	key := client.ObjectKeyFromObject(sbx)
	Eventually(ReadyReason(c, key), ReadyTimeout, 100*time.Millisecond).Should(Equal("True/Running"))
	latest := &sandboxv1alpha1.Sandbox{}
	Expect(c.Get(context.Background(), key, latest)).To(Succeed())
	return latest
}
