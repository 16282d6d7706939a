/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package admission

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/quota"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

// SnapshotPath is where the webhook server serves the SandboxSnapshot
// validator; the ValidatingWebhookConfiguration in config/webhook points at
// it.
const SnapshotPath = "/validate-sandbox-code-sandbox-dev-v1alpha1-sandboxsnapshot"

// snapshotKind is details.kind of a refused SandboxSnapshot.
const snapshotKind = "sandboxsnapshots"

// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxsnapshots,verbs=get;list;watch

// SnapshotValidator refuses a SandboxSnapshot create that would take its
// namespace past a SandboxQuota's spec.hard.snapshots. The count is read
// from the API server at each create, not reserved: two creates racing for
// the last place may both pass (docs/quota.md). The bytes cap is checked by
// the node that learns the size (controllers/sandbox/snapshot.go).
type SnapshotValidator struct {
	reader  client.Reader
	decoder admission.Decoder
}

// NewSnapshotValidator builds the validator; reader must read from the API
// server directly.
func NewSnapshotValidator(reader client.Reader, scheme *runtime.Scheme) *SnapshotValidator {
	return &SnapshotValidator{reader: reader, decoder: admission.NewDecoder(scheme)}
}

// Handle implements admission.Handler.
func (v *SnapshotValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	snap := &sandboxv1alpha1.SandboxSnapshot{}
	if err := v.decoder.Decode(req, snap); err != nil {
		return errored(http.StatusBadRequest, fmt.Errorf("decoding the SandboxSnapshot: %w", err))
	}
	if snap.Namespace == "" {
		snap.Namespace = req.Namespace
	}
	if snap.Name == "" {
		snap.Name = req.Name
	}
	var quotas sandboxv1alpha1.SandboxQuotaList
	if err := v.reader.List(ctx, &quotas, client.InNamespace(snap.Namespace)); err != nil {
		return errored(http.StatusInternalServerError, fmt.Errorf("listing the SandboxQuotas in namespace %s: %w", snap.Namespace, err))
	}
	var used *quota.SnapshotUsage
	var causes []metav1.StatusCause
	for i := range quotas.Items {
		q := &quotas.Items[i]
		if q.Spec.Hard.Snapshots == nil {
			continue
		}
		if used == nil {
			var snaps sandboxv1alpha1.SandboxSnapshotList
			if err := v.reader.List(ctx, &snaps, client.InNamespace(snap.Namespace)); err != nil {
				return errored(http.StatusInternalServerError, fmt.Errorf("listing the SandboxSnapshots in namespace %s: %w", snap.Namespace, err))
			}
			u := quota.CountSnapshots(snaps.Items, snap.UID)
			used = &u
		}
		if msg := quota.SnapshotCountExceeded(q, *used); msg != "" {
			causes = append(causes, metav1.StatusCause{Type: subresource.CauseQuotaExceeded, Field: "spec.hard.snapshots", Message: msg})
		}
	}
	if len(causes) > 0 {
		return deniedKind(snapshotKind, snap.Name, causes)
	}
	return admission.Allowed("")
}
