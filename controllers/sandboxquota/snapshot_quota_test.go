/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxquota_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

var _ = Describe("SandboxQuota spec.hard.snapshots", func() {
	snapshot := func(ns, name string) *sandboxv1alpha1.SandboxSnapshot {
		return &sandboxv1alpha1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: sandboxv1alpha1.SandboxSnapshotSpec{SandboxRef: sandboxv1alpha1.SnapshotSandboxReference{Name: "src"}}}
	}

	It("refuses a snapshot over the count, in every quota of the namespace, and admits one again after a delete", func() {
		ctx := context.Background()
		ns := newNamespace()
		newQuota(ns, "two", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Snapshots: ptr.To[int64](2)}})
		newQuota(ns, "unrelated", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Sandboxes: ptr.To[int64](5)}})
		first := snapshot(ns, "s1")
		Expect(cp.Client.Create(ctx, first)).To(Succeed())
		Expect(cp.Client.Create(ctx, snapshot(ns, "s2"))).To(Succeed())
		err := cp.Client.Create(ctx, snapshot(ns, "s3"))
		Expect(err).To(beForbidden(`sandbox quota "two": snapshots: 2 of 2 used, 1 more requested`))
		// Another namespace is not charged.
		other := newNamespace()
		Expect(cp.Client.Create(ctx, snapshot(other, "s3"))).To(Succeed())
		// A deleted snapshot frees its place (it has no finalizer: no
		// node took it here).
		Expect(cp.Client.Delete(ctx, first)).To(Succeed())
		Eventually(func() error { return cp.Client.Create(ctx, snapshot(ns, "s3")) }).Should(Succeed())
		Expect(cp.Client.List(ctx, &sandboxv1alpha1.SandboxSnapshotList{}, client.InNamespace(ns))).To(Succeed())
	})

	It("refuses every snapshot under a zero count", func() {
		ns := newNamespace()
		newQuota(ns, "none", sandboxv1alpha1.SandboxQuotaSpec{Hard: sandboxv1alpha1.SandboxQuotaHard{Snapshots: ptr.To[int64](0)}})
		Expect(cp.Client.Create(context.Background(), snapshot(ns, "s1"))).To(beForbidden(`snapshots: 0 of 0 used`))
	})
})
