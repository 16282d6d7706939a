/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FinalizerSnapshotData is the node manager's finalizer on a
// SandboxSnapshot: it keeps the object until the manager of the node that
// holds the snapshot's files has removed them. The files are not
// Kubernetes objects, so garbage collection cannot remove them.
const FinalizerSnapshotData = "sandbox.code-sandbox.dev/snapshot-data"

const (
	// SnapshotConditionReady is True once the snapshot's files are stored
	// on status.node and a Sandbox may be restored from it
	// (spec.snapshotRef). When it is False, its reason says why: one of the
	// SnapshotReason… constants.
	SnapshotConditionReady ConditionType = "Ready"

	// SandboxConditionSnapshotRestored is set on Sandboxes with
	// spec.snapshotRef: True (reason SnapshotRestored) once the snapshot's
	// files were written into the container, which is not Ready before;
	// False with reason SnapshotNotFound, SnapshotNotReady or RestoreFailed
	// otherwise.
	SandboxConditionSnapshotRestored ConditionType = "SnapshotRestored"
)

// Reasons of a SandboxSnapshot's Ready condition.
const (
	// SnapshotReasonPending: the source Sandbox does not exist yet, is not
	// bound to a node, or is not Ready; the snapshot is taken once it is.
	SnapshotReasonPending = "Pending"

	// SnapshotReasonStored: the files are stored on status.node. Used with
	// Ready=True.
	SnapshotReasonStored = "Stored"

	// SnapshotReasonTooLarge: the source's files are larger than the bound
	// of one snapshot (the source's resources.disk times its three
	// writable paths); nothing is kept. Terminal.
	SnapshotReasonTooLarge = "TooLarge"

	// SnapshotReasonQuotaExceeded: the stored snapshot would take its
	// namespace's stored snapshot bytes past a SandboxQuota's
	// spec.hard.snapshotBytes; its data was removed. Terminal: delete the
	// SandboxSnapshot.
	SnapshotReasonQuotaExceeded = "QuotaExceeded"

	// SnapshotReasonFailed: taking the snapshot failed for another reason
	// (the message says which); it is retried with backoff.
	SnapshotReasonFailed = "Failed"

	// SnapshotReasonSourceGone: the source Sandbox was deleted, expired or
	// lost its node before the snapshot was taken. Terminal.
	SnapshotReasonSourceGone = "SourceGone"
)

// Reasons of a Sandbox's SnapshotRestored condition.
const (
	// SandboxReasonSnapshotRestored: the snapshot's files were written into
	// the container. Used with SnapshotRestored=True.
	SandboxReasonSnapshotRestored = "SnapshotRestored"

	// SandboxReasonSnapshotNotFound: spec.snapshotRef names a
	// SandboxSnapshot that does not exist in the Sandbox's namespace, or
	// one being deleted. The Sandbox waits for it, unbound.
	SandboxReasonSnapshotNotFound = "SnapshotNotFound"

	// SandboxReasonSnapshotNotReady: the SandboxSnapshot exists but is not
	// Ready yet (or failed). The Sandbox waits for it, unbound.
	SandboxReasonSnapshotNotReady = "SnapshotNotReady"

	// SandboxReasonRestoreFailed: the files could not be written into the
	// container (the message says why: the stored data is missing, the
	// Sandbox's image or workingDir differ from the snapshot's source, or a
	// write failed, for example for lack of resources.disk). Retried with
	// backoff; the Sandbox is not Ready meanwhile.
	SandboxReasonRestoreFailed = "RestoreFailed"
)

// SandboxSnapshotReference names a SandboxSnapshot in the Sandbox's own
// namespace. There is no namespace field: a snapshot's files are tenant data
// and never restore into another namespace (no reference grant exists).
type SandboxSnapshotReference struct {
	// Name of the SandboxSnapshot.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +required
	Name string `json:"name"`
}

// SnapshotSandboxReference names the Sandbox a snapshot is taken from, in the
// snapshot's own namespace.
type SnapshotSandboxReference struct {
	// Name of the Sandbox.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +required
	Name string `json:"name"`
}

// SandboxSnapshotSpec says which Sandbox to take the snapshot from. It is
// fixed once the SandboxSnapshot exists.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: create a new SandboxSnapshot instead"
type SandboxSnapshotSpec struct {
	// SandboxRef names the source Sandbox in the same namespace. The
	// snapshot holds its working directory, /tmp and /var/tmp (files,
	// directories, modes), taken while its processes are stopped;
	// processes and memory are not part of it.
	// +required
	SandboxRef SnapshotSandboxReference `json:"sandboxRef"`
}

// SandboxSnapshotStatus is written only by the manager of the node that holds
// the snapshot (config/policy/snapshot_status_policy.yaml).
type SandboxSnapshotStatus struct {
	// Conditions: Ready.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Node is the node whose manager took the snapshot and holds its files:
	// a Sandbox restored from it runs there.
	// +optional
	Node string `json:"node,omitempty"`

	// SourceUID is the UID of the Sandbox the snapshot was taken from.
	// +optional
	SourceUID string `json:"sourceUID,omitempty"`

	// SizeBytes is the size of the stored snapshot (a tar stream).
	// +optional
	SizeBytes int64 `json:"sizeBytes,omitempty"`

	// ImageID is the digest of the image the source ran
	// (sha256:…, Docker's image ID). A restored Sandbox runs this image.
	// +optional
	ImageID string `json:"imageID,omitempty"`

	// Source is the shape of the source's container when the snapshot was
	// taken (image, command, working directory, user, resources, network,
	// runtime). A Sandbox restored from it must have the same image and
	// working directory.
	// +optional
	Source *SandboxTemplate `json:"source,omitempty"`

	// Storage is the reference the holding node's store returned for the
	// files: "dir:snap-<random>.tar" on that node, or, with the managers'
	// --snapshot-registry, the registry ref by digest
	// (HOST/PATH/sandboxsnapshots/NAMESPACE/UID@sha256:...), which a
	// restore on any node reads. Only the holding node's manager may write
	// it, and a reader checks it against its own store's configuration.
	// +optional
	Storage string `json:"storage,omitempty"`

	// TakenTime is when the files were read.
	// +optional
	TakenTime *metav1.Time `json:"takenTime,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=sbxsnap,categories=all
// +kubebuilder:printcolumn:name="Sandbox",type=string,JSONPath=`.spec.sandboxRef.name`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.node`
// +kubebuilder:printcolumn:name="Size",type=integer,JSONPath=`.status.sizeBytes`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// SandboxSnapshot is the files of a Sandbox's writable paths at one moment,
// stored on the node that ran it. A Sandbox with spec.snapshotRef starts
// from it there.
type SandboxSnapshot struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec SandboxSnapshotSpec `json:"spec"`
	// +optional
	Status SandboxSnapshotStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// SandboxSnapshotList contains a list of SandboxSnapshot.
type SandboxSnapshotList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxSnapshot `json:"items"`
}

// IsFailed reports whether the snapshot failed for good: it holds no data
// and never will.
func (s *SandboxSnapshot) IsFailed() bool {
	for i := range s.Status.Conditions {
		c := &s.Status.Conditions[i]
		if c.Type == string(SnapshotConditionReady) {
			switch c.Reason {
			case SnapshotReasonTooLarge, SnapshotReasonSourceGone, SnapshotReasonQuotaExceeded:
				return true
			}
		}
	}
	return false
}

// IsReady reports whether the snapshot's files are stored.
func (s *SandboxSnapshot) IsReady() bool {
	for i := range s.Status.Conditions {
		c := &s.Status.Conditions[i]
		if c.Type == string(SnapshotConditionReady) {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}

func init() {
	SchemeBuilder.Register(&SandboxSnapshot{}, &SandboxSnapshotList{})
}
