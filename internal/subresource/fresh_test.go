/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package subresource

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
)

func sandboxWithReady(status metav1.ConditionStatus, reason string) *sandboxv1alpha1.Sandbox {
	return &sandboxv1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", UID: "uid-1"},
		Status: sandboxv1alpha1.SandboxStatus{NodeName: "n1", Conditions: []metav1.Condition{{
			Type: string(sandboxv1alpha1.SandboxConditionReady), Status: status, Reason: reason, LastTransitionTime: metav1.Now(),
		}}},
	}
}

// A cache that lags a resume its caller already watched happen must not
// make the refusal: the API server's copy decides.
func TestFreshIfNotReady(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := sandboxv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	apiServer := fake.NewClientBuilder().WithScheme(scheme).WithObjects(sandboxWithReady(metav1.ConditionTrue, "Running")).Build()

	stale := sandboxWithReady(metav1.ConditionFalse, sandboxv1alpha1.SandboxReasonPaused)
	if got := FreshIfNotReady(ctx, getWith(apiServer), stale); !isReady(got) {
		t.Fatalf("a stale Paused copy was kept although the API server says Ready: %+v", got.Status.Conditions)
	}
	ready := sandboxWithReady(metav1.ConditionTrue, "Running")
	if got := FreshIfNotReady(ctx, nil, ready); got != ready {
		t.Fatal("a Ready copy must be used as it is")
	}
	if got := FreshIfNotReady(ctx, nil, stale); got != stale {
		t.Fatal("without an API reader the cached copy decides")
	}
	empty := fake.NewClientBuilder().WithScheme(scheme).Build()
	if got := FreshIfNotReady(ctx, getWith(empty), stale); got != stale {
		t.Fatal("when the API server has no copy, the cached one decides")
	}
	recreated := sandboxWithReady(metav1.ConditionTrue, "Running")
	recreated.UID = "uid-2"
	other := fake.NewClientBuilder().WithScheme(scheme).WithObjects(recreated).Build()
	if got := FreshIfNotReady(ctx, getWith(other), stale); got != stale {
		t.Fatal("a re-created Sandbox of the same name must not stand in for the old one")
	}
}

func isReady(s *sandboxv1alpha1.Sandbox) bool {
	for _, c := range s.Status.Conditions {
		if c.Type == string(sandboxv1alpha1.SandboxConditionReady) {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}

// getWith reads Sandboxes with a controller-runtime reader, as the servers do.
func getWith(r client.Reader) GetFunc {
	return func(ctx context.Context, key types.NamespacedName, sbx *sandboxv1alpha1.Sandbox) error {
		return r.Get(ctx, key, sbx)
	}
}
