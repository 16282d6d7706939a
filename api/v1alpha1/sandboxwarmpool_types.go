/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Labels the pool controller puts on the Sandboxes it keeps as a pool's
// members. They are an index; a member is only ever claimed when it also
// carries a controller ownerReference to the pool's UID (see docs/warm-pools.md).
const (
	// LabelWarmPool names the SandboxWarmPool a member Sandbox belongs to.
	LabelWarmPool = "sandbox.code-sandbox.dev/warm-pool"
	// LabelTemplateHash is the hash of the pool template a member was
	// created from; members with another hash are stale and get replaced.
	LabelTemplateHash = "sandbox.code-sandbox.dev/template-hash"
)

// Conditions a SandboxWarmPool reports in status.conditions.
const (
	// SandboxWarmPoolConditionReady is True when the pool holds
	// spec.replicas idle members of the current template (reason Filled).
	// When it is False, the reason says why: Filling, RollingOut or
	// MembersFailing.
	SandboxWarmPoolConditionReady ConditionType = "Ready"
)

// Reasons for the SandboxWarmPool Ready condition.
const (
	// SandboxWarmPoolReasonFilled: every desired member is idle, paused and
	// made from the current template.
	SandboxWarmPoolReasonFilled = "Filled"
	// SandboxWarmPoolReasonFilling: members are being created, provisioned
	// or paused, for example after a scale-up or after claims took members.
	SandboxWarmPoolReasonFilling = "Filling"
	// SandboxWarmPoolReasonRollingOut: the template changed and stale
	// members are being replaced, at most one per node at a time.
	SandboxWarmPoolReasonRollingOut = "RollingOut"
	// SandboxWarmPoolReasonMembersFailing: members cannot be created (for
	// example the namespace's SandboxQuota refuses them) or do not become
	// ready (for example ImageNotFound); the message says which and why.
	SandboxWarmPoolReasonMembersFailing = "MembersFailing"
)

// SandboxTemplate is the part of a Sandbox spec that shapes its container.
// A pool's members are created from it, and a Sandbox that claims from the
// pool runs a container made from it. The fields mean, default and are
// validated exactly as the Sandbox fields of the same name.
type SandboxTemplate struct {
	// Image is the container image.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^[^\s]+$`
	// +required
	Image string `json:"image"`

	// ImagePullPolicy is IfNotPresent (default), Always or Never.
	// +kubebuilder:default=IfNotPresent
	// +optional
	ImagePullPolicy ImagePullPolicy `json:"imagePullPolicy,omitempty"`

	// Command replaces the image's entrypoint and command; empty runs the
	// manager's idle process. At most 64 KiB in all, as a Sandbox's.
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:XValidation:rule="self.map(c, size(c)).sum() <= 65536",message="command must total at most 65536 bytes"
	// +listType=atomic
	// +optional
	Command []string `json:"command,omitempty"`

	// WorkingDir is the absolute path where commands start, a writable tmpfs.
	// +kubebuilder:default="/app"
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/')",message="workingDir must be an absolute path"
	// +kubebuilder:validation:XValidation:rule="!self.split('/').exists(p, p == '..' || p == '.')",message="workingDir must not contain '.' or '..' segments"
	// +kubebuilder:validation:XValidation:rule="!(self in ['/', '/proc', '/sys', '/dev', '/etc', '/tmp', '/var/tmp', '/dev/shm']) && !self.startsWith('/proc/') && !self.startsWith('/sys/') && !self.startsWith('/dev/')",message="workingDir must not be /, /etc, /tmp, /var/tmp or a path under /proc, /sys or /dev"
	// +optional
	WorkingDir string `json:"workingDir,omitempty"`

	// User is the uid[:gid] the sandbox runs as; never root.
	// +kubebuilder:default="65534:65534"
	// +kubebuilder:validation:Pattern=`^[0-9]{1,10}(:[0-9]{1,10})?$`
	// +kubebuilder:validation:XValidation:rule="self.split(':')[0] != '0' && !self.split(':')[0].matches('^0+$')",message="user must not be root (uid 0)"
	// +optional
	User string `json:"user,omitempty"`

	// Resources bounds CPU, memory, processes and disk.
	// +kubebuilder:default={}
	// +optional
	Resources SandboxResources `json:"resources,omitempty"`

	// Network configures network access; the default is none.
	// +kubebuilder:default={}
	// +optional
	Network SandboxNetwork `json:"network,omitempty"`

	// Runtime is runc (default) or gvisor.
	// +kubebuilder:default=runc
	// +optional
	Runtime RuntimeClass `json:"runtime,omitempty"`
}

// SandboxWarmPoolSpec is the desired state of a SandboxWarmPool.
type SandboxWarmPoolSpec struct {
	// Replicas is how many idle, paused members the pool keeps. Claims take
	// members out of the pool and the pool refills in the background. The
	// scale subresource drives it, so an HPA or KEDA can size the pool.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// Template shapes every member's container. Changing it replaces the
	// idle members made from the old template, at most one per node at a
	// time; Sandboxes already claimed keep their container.
	// +required
	Template SandboxTemplate `json:"template"`
}

// SandboxWarmPoolStatus is the observed state of a SandboxWarmPool.
type SandboxWarmPoolStatus struct {
	// Replicas is the number of members the pool holds now, ready or not,
	// stale or not (claimed and deleting members are not counted).
	// +optional
	Replicas int32 `json:"replicas"`

	// ReadyReplicas is the number of idle members a claim can take now:
	// provisioned, paused and made from the current template.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`

	// Selector is the label selector of the member Sandboxes, for the scale
	// subresource (an HPA needs it).
	// +optional
	Selector string `json:"selector,omitempty"`

	// Conditions: Ready.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=swp,categories=all
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Image",type=string,JSONPath=`.spec.template.image`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// SandboxWarmPool keeps a number of sandboxes created, started and paused,
// so that a Sandbox naming the pool in spec.warmPoolRef is Ready in
// milliseconds instead of waiting for a container to be created.
type SandboxWarmPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec SandboxWarmPoolSpec `json:"spec"`
	// +optional
	Status SandboxWarmPoolStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// SandboxWarmPoolList contains a list of SandboxWarmPool.
type SandboxWarmPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SandboxWarmPool `json:"items"`
}

// WarmPoolReference names a SandboxWarmPool in the Sandbox's namespace.
type WarmPoolReference struct {
	// Name of the SandboxWarmPool.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
}

// WarmPoolMemberReference identifies the member Sandbox whose container a
// claiming Sandbox took over.
type WarmPoolMemberReference struct {
	// Name of the member Sandbox (it is deleted once claimed).
	// +required
	Name string `json:"name"`
	// UID of the member Sandbox: its container carries this UID.
	// +required
	UID types.UID `json:"uid"`
}

// SandboxWarmPoolClaimStatus records how a Sandbox with spec.warmPoolRef got
// its container. Only the node's manager writes it.
type SandboxWarmPoolClaimStatus struct {
	// Member is the pool member whose container this Sandbox runs in; empty
	// after a cold start from the template.
	// +optional
	Member *WarmPoolMemberReference `json:"member,omitempty"`

	// TemplateHash is the hash of the pool template the container was made
	// from.
	// +optional
	TemplateHash string `json:"templateHash,omitempty"`

	// Template is the pool template the container was made from, as it was
	// at the claim. Quota counts these resources, and exec and files use its
	// working directory, whatever the pool's template says later.
	// +optional
	Template *SandboxTemplate `json:"template,omitempty"`
}

// ContainerUID is the UID the Sandbox's container is labelled and named
// with: its own, or for a Sandbox with spec.warmPoolRef (or spec.snapshotRef:
// a fork served by an idle member of a pool with its shape) that claimed a
// warm pool member, the member's. Only the managers write status, and
// status.warmPool.member only comes from this node's claim: a claim starts
// from an empty status (a manager of another node may have written the
// status of the Sandbox while it was unbound), and the manager adopts a
// member's container only if its labels name a Sandbox of the same
// namespace on its node (controllers/sandbox, verifyMemberContainer). A Sandbox
// with neither field never runs in another one's container, whatever its
// status says.
func (s *Sandbox) ContainerUID() types.UID {
	if (s.Spec.WarmPoolRef != nil || s.Spec.SnapshotRef != nil) && s.Status.WarmPool != nil && s.Status.WarmPool.Member != nil && s.Status.WarmPool.Member.UID != "" {
		return s.Status.WarmPool.Member.UID
	}
	return s.UID
}

func init() {
	SchemeBuilder.Register(&SandboxWarmPool{}, &SandboxWarmPoolList{})
}
