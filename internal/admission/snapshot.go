/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package admission

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/quota"
)

// SnapshotPath is where the webhook server serves the SandboxSnapshot
// validator; the ValidatingWebhookConfiguration in config/webhook points at
// it.
const SnapshotPath = "/validate-sandbox-code-sandbox-dev-v1alpha1-sandboxsnapshot"

// snapshotKind is details.kind of a refused SandboxSnapshot.
const snapshotKind = "sandboxsnapshots"

// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxsnapshots,verbs=get;list;watch

// SnapshotValidator charges a SandboxSnapshot create to every SandboxQuota
// of its namespace, through the same reservation path as a Sandbox
// (charger): one snapshot is added to status.used and reserved, written
// with the quota's resourceVersion, so that two creates racing for the last
// place cannot both pass. A snapshot's bytes are unknown at create: it is
// refused while the namespace's stored bytes (status.used.snapshotBytes,
// counted by the quota controller from the sizes the nodes record) are at
// or over spec.hard.snapshotBytes, and the node that learns its size checks
// it once more (controllers/sandbox/snapshot.go).
type SnapshotValidator struct {
	charger
	decoder admission.Decoder
}

// NewSnapshotValidator builds the validator. reader must read from the API
// server directly (a manager's GetAPIReader); writer writes quota status.
func NewSnapshotValidator(reader client.Reader, writer client.Client, scheme *runtime.Scheme, clk clock.PassiveClock) *SnapshotValidator {
	return &SnapshotValidator{charger: charger{reader: reader, writer: writer, clock: clk}, decoder: admission.NewDecoder(scheme)}
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
	if snap.UID == "" {
		return errored(http.StatusBadRequest, errors.New("the SandboxSnapshot in the admission request has no metadata.uid"))
	}
	quotas, err := v.quotas(ctx, snap.Namespace)
	if err != nil {
		return errored(http.StatusInternalServerError, err)
	}
	// A quota that limits no snapshot figure is not charged: its status
	// still shows what the controller counts.
	limiting := quotas[:0]
	for i := range quotas {
		if quotas[i].Spec.Hard.Snapshots != nil || quotas[i].Spec.Hard.SnapshotBytes != nil {
			limiting = append(limiting, quotas[i])
		}
	}
	if len(limiting) == 0 {
		return admission.Allowed("")
	}
	sub := subject{kind: sandboxv1alpha1.ReservationKindSnapshot, details: snapshotKind, namespace: snap.Namespace, name: snap.Name, uid: snap.UID}
	_, resp := v.chargeAll(ctx, limiting, sub, quota.SnapshotRequest(), req.DryRun != nil && *req.DryRun, nil, nil)
	return resp
}
