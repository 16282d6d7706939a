/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package manifests

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

// The rendered ValidatingWebhookConfiguration, installed as is while no
// webhook answers (its Service does not exist here): what the API server
// then refuses and lets through is exactly what it calls the webhook for.
var _ = Describe("The webhook configuration, installed while no webhook answers", Ordered, func() {
	const hold = "test.code-sandbox.dev/hold"
	var (
		ns        string
		sbx       *sandboxv1alpha1.Sandbox
		egressSbx *sandboxv1alpha1.Sandbox
		snap      *sandboxv1alpha1.SandboxSnapshot
	)

	newSandbox := func(name string) *sandboxv1alpha1.Sandbox {
		return &sandboxv1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: sandboxv1alpha1.SandboxSpec{
				Image:                 "python:3.12-slim-bookworm",
				ActiveDeadlineSeconds: ptr.To[int64](3600),
			},
		}
	}

	BeforeAll(func(ctx SpecContext) {
		ns = cp.NewNamespace("webhook-")
		// Made before the webhook configuration exists, with a finalizer
		// standing in for the manager's.
		sbx = newSandbox("existing")
		sbx.Finalizers = []string{hold}
		Expect(cp.Client.Create(ctx, sbx)).To(Succeed())
		egressSbx = newSandbox("existing-egress")
		egressSbx.Spec.Network = sandboxv1alpha1.SandboxNetwork{Mode: sandboxv1alpha1.NetworkEgress,
			Egress: &sandboxv1alpha1.EgressPolicy{Allow: []sandboxv1alpha1.EgressRule{{Host: "a.example.com"}}}}
		Expect(cp.Client.Create(ctx, egressSbx)).To(Succeed())
		snap = &sandboxv1alpha1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "existing"},
			Spec: sandboxv1alpha1.SandboxSnapshotSpec{SandboxRef: sandboxv1alpha1.SnapshotSandboxReference{Name: sbx.Name}}}
		Expect(cp.Client.Create(ctx, snap)).To(Succeed())

		vwc := find(render("config/default"), "ValidatingWebhookConfiguration", "code-sandbox-validating-webhook-configuration")
		Expect(applyForReal(ctx, vwc)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			Expect(client.IgnoreNotFound(cp.Client.Delete(ctx, vwc))).To(Succeed())
			// Later specs create Sandboxes; wait until the API server no
			// longer calls the webhook.
			Eventually(func(ctx SpecContext) error {
				return cp.Client.Create(ctx, newSandbox("probe"), client.DryRunAll)
			}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		})
		// The API server picks the configuration up asynchronously.
		Eventually(func(ctx SpecContext) error {
			return cp.Client.Create(ctx, newSandbox("probe"), client.DryRunAll)
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(HaveOccurred())
	})

	It("refuses new Sandboxes: it fails closed, dry runs included", func(ctx SpecContext) {
		err := cp.Client.Create(ctx, newSandbox("new"))
		Expect(err).To(MatchError(ContainSubstring(`failed calling webhook "sandbox-quota.code-sandbox.dev"`)))
		Expect(apierrors.IsNotFound(cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "new"}, &sandboxv1alpha1.Sandbox{}))).To(BeTrue())
		Expect(cp.Client.Create(ctx, newSandbox("new"), client.DryRunAll)).
			To(MatchError(ContainSubstring(`failed calling webhook "sandbox-quota.code-sandbox.dev"`)))
	})

	It("refuses changing, adding or removing activeDeadlineSeconds", func(ctx SpecContext) {
		for _, deadline := range []any{int64(7200), nil} {
			patch := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"activeDeadlineSeconds": deadline}}}
			data, err := patch.MarshalJSON()
			Expect(err).NotTo(HaveOccurred())
			Expect(cp.Client.Patch(ctx, sbx.DeepCopy(), client.RawPatch("application/merge-patch+json", data))).
				To(MatchError(ContainSubstring(`failed calling webhook "sandbox-deadline.code-sandbox.dev"`)), "deadline %v", deadline)
		}
	})

	It("refuses changing the egress policy", func(ctx SpecContext) {
		cur := &sandboxv1alpha1.Sandbox{}
		Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(egressSbx), cur)).To(Succeed())
		cur.Spec.Network.Egress.Allow = append(cur.Spec.Network.Egress.Allow, sandboxv1alpha1.EgressRule{Host: "b.example.com"})
		Expect(cp.Client.Update(ctx, cur)).To(MatchError(ContainSubstring(`failed calling webhook "sandbox-egress.code-sandbox.dev"`)))
		cur.Labels = map[string]string{"touched": "yes"}
		cur.Spec.Network.Egress.Allow = cur.Spec.Network.Egress.Allow[:1]
		Expect(cp.Client.Update(ctx, cur)).To(Succeed(), "an update that keeps the policy must not call the webhook")
	})

	It("refuses a SandboxSnapshot claim (status.node set) and lets its other status updates through", func(ctx SpecContext) {
		// The snapshot was made before the configuration existed (creates
		// call the snapshot webhook, which does not answer here).
		cur := &sandboxv1alpha1.SandboxSnapshot{}
		Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(snap), cur)).To(Succeed())
		cur.Status.SizeBytes = 10
		// Eventually: another Describe's snapshot status policy, deleted
		// just before, may still be enforced for a moment; the webhook,
		// which does not answer, would refuse every try.
		Eventually(func(ctx SpecContext) error { return cp.Client.Status().Update(ctx, cur) }).WithContext(ctx).WithTimeout(10*time.Second).
			Should(Succeed(), "a status update that keeps status.node must not call the webhook")
		cur.Status.Node = "n1"
		Expect(cp.Client.Status().Update(ctx, cur)).
			To(MatchError(ContainSubstring(`failed calling webhook "sandbox-snapshot-claim.code-sandbox.dev"`)))
		Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(snap), cur)).To(Succeed())
		Expect(cur.Status.Node).To(BeEmpty())
		Expect(cur.Status.SizeBytes).To(BeEquivalentTo(10))
	})

	It("lets every other update through: labels, status, finalizer removal and deletion", func(ctx SpecContext) {
		cur := &sandboxv1alpha1.Sandbox{}
		Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(sbx), cur)).To(Succeed())
		cur.Labels = map[string]string{"touched": "yes"}
		Expect(cp.Client.Update(ctx, cur)).To(Succeed(), "a metadata update must not call the webhook")

		cur.Status.NodeName = "n1"
		Expect(cp.Client.Status().Update(ctx, cur)).To(Succeed(), "a status update must not call the webhook")

		Expect(cp.Client.Delete(ctx, cur)).To(Succeed(), "DELETE is not matched")
		Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(sbx), cur)).To(Succeed())
		Expect(cur.DeletionTimestamp).NotTo(BeNil())
		cur.Finalizers = nil
		Expect(cp.Client.Update(ctx, cur)).To(Succeed(), "removing the finalizer must not depend on the webhook")
		Eventually(func(ctx SpecContext) bool {
			return apierrors.IsNotFound(cp.Client.Get(ctx, client.ObjectKeyFromObject(sbx), &sandboxv1alpha1.Sandbox{}))
		}).WithContext(ctx).WithTimeout(10 * time.Second).Should(BeTrue())
	})
})
