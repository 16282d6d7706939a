/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Conditions a SandboxQuota reports in status.conditions.
const (
	// SandboxQuotaConditionReady is True once status.used has been counted
	// from the namespace's Sandboxes for the current spec, so that what
	// `kubectl get sandboxquotas` shows can be trusted. Admission does not
	// wait for it: every create is checked and charged against status.used
	// with optimistic concurrency whatever this condition says.
	SandboxQuotaConditionReady ConditionType = "Ready"

	// SandboxQuotaConditionExhausted is True when at least one limit in
	// spec.hard is fully used (reason LimitReached) or, after the limit was
	// lowered, exceeded (reason OverLimit). New Sandboxes that need more of
	// that resource are refused until usage drops.
	SandboxQuotaConditionExhausted ConditionType = "Exhausted"
)

// Reasons for the SandboxQuota conditions.
const (
	// SandboxQuotaReasonCounted: status.used was counted from the
	// namespace's Sandboxes. Used with Ready=True.
	SandboxQuotaReasonCounted = "Counted"

	// SandboxQuotaReasonCountFailed: usage could not be counted; the message
	// holds the error. Admission still enforces the last recorded usage.
	SandboxQuotaReasonCountFailed = "CountFailed"

	// SandboxQuotaReasonWithinLimits: every limit has room left. Used with
	// Exhausted=False.
	SandboxQuotaReasonWithinLimits = "WithinLimits"

	// SandboxQuotaReasonLimitReached: a limit is fully used; the message
	// names it.
	SandboxQuotaReasonLimitReached = "LimitReached"

	// SandboxQuotaReasonOverLimit: usage is above a limit, which happens when
	// a limit is lowered below what already runs. Running Sandboxes are not
	// stopped; new ones are refused until usage falls below the limit.
	SandboxQuotaReasonOverLimit = "OverLimit"
)

// SandboxQuotaHard caps what all Sandboxes in the namespace may request
// together. A field left out is not limited.
type SandboxQuotaHard struct {
	// Sandboxes is the most Sandboxes that may exist at once.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Sandboxes *int64 `json:"sandboxes,omitempty"`

	// CPU caps the sum of spec.resources.cpu.
	// +kubebuilder:validation:XValidation:rule="quantity(self).compareTo(quantity('0')) >= 0",message="cpu must not be negative"
	// +optional
	CPU *resource.Quantity `json:"cpu,omitempty"`

	// Memory caps the sum of spec.resources.memory.
	// +kubebuilder:validation:XValidation:rule="quantity(self).compareTo(quantity('0')) >= 0",message="memory must not be negative"
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`

	// Disk caps the sum of spec.resources.disk.
	// +kubebuilder:validation:XValidation:rule="quantity(self).compareTo(quantity('0')) >= 0",message="disk must not be negative"
	// +optional
	Disk *resource.Quantity `json:"disk,omitempty"`

	// Snapshots is the most SandboxSnapshots that may exist at once: a
	// create beyond it is refused by the webhook, which charges each
	// admitted snapshot to status.used as it does a Sandbox. Snapshots being deleted,
	// and those that failed for good (TooLarge, SourceGone,
	// QuotaExceeded), do not count.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Snapshots *int64 `json:"snapshots,omitempty"`

	// SnapshotBytes caps the bytes of the namespace's stored snapshots
	// together (status.sizeBytes). A snapshot's size is known only once
	// its node has read it: a snapshot that would take the total past the
	// cap fails with reason QuotaExceeded, and its node removes its data
	// at once. While the stored bytes are at or over the cap, the webhook
	// refuses new snapshots.
	// +kubebuilder:validation:XValidation:rule="quantity(self).compareTo(quantity('0')) >= 0",message="snapshotBytes must not be negative"
	// +optional
	SnapshotBytes *resource.Quantity `json:"snapshotBytes,omitempty"`
}

// SandboxQuotaSpec is the desired policy for Sandboxes in one namespace.
// Every SandboxQuota in a namespace applies: a Sandbox is admitted only if
// all of them allow it.
// +kubebuilder:validation:XValidation:rule="!has(self.egress) || self.allowEgress",message="egress rules need allowEgress: true (without it no Sandbox may have network mode Egress at all)"
type SandboxQuotaSpec struct {
	// Hard caps the total resources of the namespace's Sandboxes.
	// +optional
	Hard SandboxQuotaHard `json:"hard,omitempty"`

	// MaxActiveDeadlineSeconds is the longest lifetime a Sandbox may ask
	// for. When it is set, every Sandbox must set
	// spec.activeDeadlineSeconds, and to no more than this.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2592000
	// +optional
	MaxActiveDeadlineSeconds *int64 `json:"maxActiveDeadlineSeconds,omitempty"`

	// AllowedImages are the image patterns Sandboxes may use; empty allows
	// every image. In a pattern, `*` matches any characters except `/`, `**`
	// matches any characters including `/`, and `?` matches one character
	// other than `/`. An image is allowed when a pattern matches the image
	// as written in the Sandbox or its normalized form, in which Docker Hub
	// names are spelt out and a missing tag is `latest`: `python:3.12`
	// becomes `docker.io/library/python:3.12`. A pattern's Docker Hub
	// repository is spelt out the same way, so `python:*` also matches
	// `docker.io/library/python:3.12`.
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=512
	// +kubebuilder:validation:items:Pattern=`^[^\s]+$`
	// +listType=set
	// +optional
	AllowedImages []string `json:"allowedImages,omitempty"`

	// AllowedRuntimes are the runtimes Sandboxes may use; empty allows every
	// runtime.
	// +kubebuilder:validation:MaxItems=8
	// +listType=set
	// +optional
	AllowedRuntimes []RuntimeClass `json:"allowedRuntimes,omitempty"`

	// AllowEgress lets Sandboxes ask for network.mode Egress. It defaults to
	// false: where a SandboxQuota exists, Sandboxes get no network unless it
	// says so.
	// +kubebuilder:default=false
	// +optional
	AllowEgress bool `json:"allowEgress,omitempty"`

	// Egress narrows what Sandboxes with network.mode Egress may reach.
	// Only with allowEgress.
	// +optional
	Egress *SandboxQuotaEgress `json:"egress,omitempty"`
}

// SandboxQuotaEgress limits the egress policies (spec.network.egress) of a
// namespace's Sandboxes. The webhook checks it when a Sandbox is created and
// whenever its policy changes, and for a warm pool's template.
type SandboxQuotaEgress struct {
	// RequirePolicy refuses Egress Sandboxes without spec.network.egress,
	// which would reach the whole public internet. False (default) keeps
	// them allowed.
	// +kubebuilder:default=false
	// +optional
	RequirePolicy bool `json:"requirePolicy,omitempty"`

	// AllowedHosts are the host patterns a Sandbox's policy may allow; empty
	// allows any. A pattern is written like a policy's host: api.example.com
	// allows only that name, *.example.com allows every name below
	// example.com, and so a policy's *.api.example.com or a.example.com, but
	// not example.com itself. A non-empty list also refuses Sandboxes
	// without a policy, as requirePolicy does: they would reach hosts
	// outside it.
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:XValidation:rule="self.matches('^([*][.])?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?[.])+[a-z]([-a-z0-9]{0,61}[a-z0-9])?$')",message="each allowed host must be a lower-case DNS name of two or more labels, optionally starting with '*.' (no IP addresses, no trailing dot, no '*' elsewhere)"
	// +listType=set
	// +optional
	AllowedHosts []string `json:"allowedHosts,omitempty"`
}

// SandboxQuotaUsage is an amount of each limited resource.
type SandboxQuotaUsage struct {
	// Sandboxes is a number of Sandboxes.
	// +optional
	Sandboxes int64 `json:"sandboxes"`

	// CPU is a sum of spec.resources.cpu.
	// +optional
	CPU resource.Quantity `json:"cpu"`

	// Memory is a sum of spec.resources.memory.
	// +optional
	Memory resource.Quantity `json:"memory"`

	// Disk is a sum of spec.resources.disk.
	// +optional
	Disk resource.Quantity `json:"disk"`

	// Snapshots is a number of SandboxSnapshots: those that count (not
	// being deleted, not failed for good), and those admitted but not yet
	// seen by the quota controller.
	// +optional
	Snapshots int64 `json:"snapshots,omitempty"`

	// SnapshotBytes is the sum of status.sizeBytes of the stored (Ready)
	// SandboxSnapshots that count. Only the manager of the node holding a
	// snapshot writes its size (config/policy/snapshot_status_policy.yaml).
	// +optional
	SnapshotBytes *resource.Quantity `json:"snapshotBytes,omitempty"`
}

// Kinds of object a SandboxQuotaReservation stands for.
const (
	// ReservationKindSandbox: a Sandbox (also the meaning of an empty kind).
	ReservationKindSandbox = "Sandbox"
	// ReservationKindSnapshot: a SandboxSnapshot.
	ReservationKindSnapshot = "SandboxSnapshot"
)

// SandboxQuotaReservation is usage charged at admission for a Sandbox (or a
// SandboxSnapshot) that the quota controller has not seen yet. It keeps the charge from being lost
// when usage is recounted while the create is still in flight; the
// controller drops it once the Sandbox shows up, or once the create has
// evidently failed.
type SandboxQuotaReservation struct {
	// Kind of the object: Sandbox (also when empty) or SandboxSnapshot.
	// +kubebuilder:validation:Enum=Sandbox;SandboxSnapshot
	// +optional
	Kind string `json:"kind,omitempty"`

	// Name of the Sandbox or SandboxSnapshot.
	// +required
	Name string `json:"name"`

	// UID of the object, assigned before admission.
	// +required
	UID types.UID `json:"uid"`

	// Time the reservation was made.
	// +required
	Time metav1.Time `json:"time"`

	// Usage charged for the Sandbox.
	// +required
	Usage SandboxQuotaUsage `json:"usage"`
}

// SandboxQuotaStatus is the observed usage.
type SandboxQuotaStatus struct {
	// Conditions: Ready and Exhausted.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Used is what the namespace's Sandboxes and SandboxSnapshots use now,
	// including admitted ones still being created. Sandboxes being deleted
	// or expired do not count: their containers are being, or have been,
	// removed; nor do snapshots being deleted or failed for good.
	// +optional
	Used SandboxQuotaUsage `json:"used,omitempty"`

	// Summary is used/hard for each limit, for `kubectl get`.
	// +optional
	Summary string `json:"summary,omitempty"`

	// Reservations are admitted Sandboxes not yet counted; see
	// SandboxQuotaReservation.
	// +listType=map
	// +listMapKey=uid
	// +optional
	Reservations []SandboxQuotaReservation `json:"reservations,omitempty"`

	// ObservedGeneration is the spec generation that status.used was last
	// counted for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=sbxquota
// +kubebuilder:printcolumn:name="Used/Hard",type=string,JSONPath=`.status.summary`
// +kubebuilder:printcolumn:name="Exhausted",type=string,JSONPath=`.status.conditions[?(@.type=="Exhausted")].status`
// +kubebuilder:printcolumn:name="Sandboxes",type=integer,JSONPath=`.status.used.sandboxes`,priority=1
// +kubebuilder:printcolumn:name="Snapshots",type=integer,JSONPath=`.status.used.snapshots`,priority=1
// +kubebuilder:printcolumn:name="Egress",type=boolean,JSONPath=`.spec.allowEgress`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// SandboxQuota caps how many Sandboxes a namespace may run and how much CPU,
// memory and disk they may take together, and which images, runtimes and
// network access they may use. It is enforced at admission by the
// operator's validating webhook.
type SandboxQuota struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec SandboxQuotaSpec `json:"spec"`
	// +optional
	Status SandboxQuotaStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// SandboxQuotaList contains a list of SandboxQuota.
type SandboxQuotaList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxQuota `json:"items"`
}

func init() {
	SchemeBuilder.Register(&SandboxQuota{}, &SandboxQuotaList{})
}
