/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"
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
// +kubebuilder:rbac:groups=sandbox.code-sandbox.dev,resources=sandboxes,verbs=get

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
	if req.Operation == admissionv1.Update && req.SubResource == "status" {
		return v.status(ctx, req)
	}
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

// NodeNameExtra is the user extra in which the API server names the node of
// the Pod a service account token is bound to. A node manager's requests
// carry it, and nobody can set it but the API server.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// maxSnapshotObjectBytes bounds each object of a status update before it is
// decoded: etcd stores no object over 1.5 MiB (its default request limit),
// so a larger one is not a SandboxSnapshot the API server could keep.
const maxSnapshotObjectBytes = 3 << 19

// fieldStatusNode is the field of a refused claim's cause.
const fieldStatusNode = "status.node"

// snapshotClaim is what the status check reads of a SandboxSnapshot: it is
// decoded instead of the whole object, whose status.source may be large.
type snapshotClaim struct {
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		SandboxRef struct {
			Name string `json:"name"`
		} `json:"sandboxRef"`
	} `json:"spec"`
	Status struct {
		Node string `json:"node"`
	} `json:"status"`
}

// status checks an update of sandboxsnapshots/status that changes
// status.node (the webhook configuration sends only those; anything else
// passes here without a read). status.node decides which node's manager
// may write the snapshot's status from then on, where a restore runs, and,
// through the failures that manager may record, what a quota counts. The
// status policy (config/policy/snapshot_status_policy.yaml) lets a manager
// claim an unclaimed snapshot only for its own node, but it sees one object
// and so cannot tell whether the source Sandbox runs there. This does: a
// claim is allowed only for the node the source Sandbox's status.nodeName
// names (which only that node's manager may have written:
// sandbox_status_policy.yaml), and only in a request the API server names
// that same node in (a token bound to a Pod on it). A claimed snapshot's
// node never changes.
func (v *SnapshotValidator) status(ctx context.Context, req admission.Request) admission.Response {
	if len(req.Object.Raw) > maxSnapshotObjectBytes || len(req.OldObject.Raw) > maxSnapshotObjectBytes {
		return errored(http.StatusBadRequest, fmt.Errorf("the SandboxSnapshot in the admission request is over %d bytes", maxSnapshotObjectBytes))
	}
	var snap, old snapshotClaim
	if err := json.Unmarshal(req.Object.Raw, &snap); err != nil {
		return errored(http.StatusBadRequest, fmt.Errorf("decoding the SandboxSnapshot: %w", err))
	}
	if err := json.Unmarshal(req.OldObject.Raw, &old); err != nil {
		return errored(http.StatusBadRequest, fmt.Errorf("decoding the old SandboxSnapshot: %w", err))
	}
	node, oldNode := snap.Status.Node, old.Status.Node
	if node == oldNode {
		return admission.Allowed("")
	}
	ns, name := req.Namespace, req.Name
	if ns == "" {
		ns = snap.Metadata.Namespace
	}
	if name == "" {
		name = snap.Metadata.Name
	}
	key := "SandboxSnapshot " + ns + "/" + name
	refuse := func(format string, args ...any) admission.Response {
		return deniedKind(snapshotKind, name, []metav1.StatusCause{{
			Type: subresource.CauseSnapshotClaim, Field: fieldStatusNode, Message: fmt.Sprintf(format, args...)}})
	}
	if oldNode != "" {
		to := "no node"
		if node != "" {
			to = "node " + node
		}
		return refuse("%s is held by node %s: its status.node may not change (to %s)", key, oldNode, to)
	}
	source := snap.Spec.SandboxRef.Name
	if source == "" {
		return refuse("%s may not be claimed for node %s: it names no source Sandbox", key, node)
	}
	sbx := &sandboxv1alpha1.Sandbox{}
	switch err := v.reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: source}, sbx); {
	case apierrors.IsNotFound(err):
		return refuse("%s may not be claimed for node %s: its source Sandbox %s does not exist", key, node, source)
	case err != nil:
		return errored(http.StatusInternalServerError, fmt.Errorf("reading the source Sandbox %s of %s: %w", source, key, err))
	}
	if sbx.Status.NodeName != node {
		on := "is bound to no node"
		if sbx.Status.NodeName != "" {
			on = "runs on node " + sbx.Status.NodeName
		}
		return refuse("%s may not be claimed for node %s: its source Sandbox %s %s", key, node, source, on)
	}
	nodes := req.UserInfo.Extra[NodeNameExtra]
	if len(nodes) != 1 || nodes[0] != node {
		asker := "no node"
		switch {
		case len(nodes) == 1:
			asker = "node " + nodes[0]
		case len(nodes) > 1:
			asker = fmt.Sprintf("%d nodes", len(nodes))
		}
		return refuse("%s may be claimed for node %s (where its source Sandbox %s runs) only by that node's manager, with a token bound to a Pod on it; this request comes from %s",
			key, node, source, asker)
	}
	return admission.Allowed("")
}
