/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FinalizerContainer is the node manager's finalizer: it keeps a Sandbox
// until its container is proven gone. Docker containers are not Kubernetes
// objects, so garbage collection cannot remove them. The control plane
// removes it too, from a deleted Sandbox whose node is lost
// (controllers/sandboxnode).
const FinalizerContainer = "sandbox.code-sandbox.dev/container"

// ConditionType is a type of condition a Sandbox reports in status.conditions.
type ConditionType string

func (c ConditionType) String() string { return string(c) }

const (
	// SandboxConditionReady is True while the sandbox's container runs and
	// accepts work. When it is False, its reason says why: one of the
	// SandboxReason… constants.
	SandboxConditionReady ConditionType = "Ready"

	// SandboxConditionExpired is True once activeDeadlineSeconds has passed
	// and the container has been removed. An expired Sandbox is never
	// provisioned again; delete it.
	SandboxConditionExpired ConditionType = "Expired"

	// SandboxConditionPaused is True while the sandbox's container is
	// frozen: its processes get no CPU and keep their memory. Its reason
	// says why:
	//   - Paused: spec.paused is true. Ready is False (reason Paused)
	//     meanwhile, and exec and file transfers are refused until
	//     spec.paused is false again.
	//   - Idle: spec.lifecycle.idlePauseSeconds passed without activity.
	//     Ready stays True: the next exec or file transfer thaws the
	//     container and runs (the condition then turns False, reason
	//     Resumed).
	SandboxConditionPaused ConditionType = "Paused"

	// SandboxConditionWarmPoolClaim is set on Sandboxes with
	// spec.warmPoolRef once a manager claimed them: True (reason
	// WarmPoolClaimed) when the Sandbox took an idle member's container,
	// False (reason WarmPoolEmpty) when no member was idle and the container
	// was created from the pool's template instead. Neither is an error.
	SandboxConditionWarmPoolClaim ConditionType = "WarmPoolClaim"

	// SandboxConditionEgressPolicyApplied is set on running Sandboxes with
	// an egress policy (spec.network.egress): True (reason
	// EgressPolicyApplied) once the node's egress proxy enforces the
	// current policy, False when it could not be applied as written. The
	// manager fails closed: what it cannot apply is refused, never
	// allowed. Reasons: EgressPolicyApplied, SecretNotFound,
	// SecretForbidden, EgressPolicyInvalid, EgressProxyUnavailable.
	SandboxConditionEgressPolicyApplied ConditionType = "EgressPolicyApplied"
)

// Reasons for the EgressPolicyApplied condition (and, for
// EgressProxyUnavailable, Ready).
const (
	// SandboxReasonEgressPolicyApplied: the proxy enforces the policy as
	// written. Used with EgressPolicyApplied=True.
	SandboxReasonEgressPolicyApplied = "EgressPolicyApplied"

	// SandboxReasonSecretNotFound: an inject rule's Secret, or its key,
	// does not exist in the Sandbox's namespace. That host is refused until
	// it does; the manager retries.
	SandboxReasonSecretNotFound = "SecretNotFound"

	// SandboxReasonSecretForbidden: the node managers may not read an
	// inject rule's Secret (no RoleBinding in the namespace), or it lacks
	// the label sandbox.code-sandbox.dev/egress-credential=true. That host
	// is refused.
	SandboxReasonSecretForbidden = "SecretForbidden"

	// SandboxReasonEgressPolicyInvalid: the egress proxy refused the
	// policy; the sandbox reaches nothing until it is fixed.
	SandboxReasonEgressPolicyInvalid = "EgressPolicyInvalid"

	// SandboxReasonEgressProxyUnavailable: the node's manager runs no
	// egress proxy. With Ready=False, the container was not created, since
	// a Sandbox with a policy must never run unrestricted.
	SandboxReasonEgressProxyUnavailable = "EgressProxyUnavailable"
)

// Reasons for the Ready and Expired conditions.
const (
	// SandboxReasonPending: no manager has claimed the Sandbox yet because
	// the nodes that looked at it were at capacity. A Sandbox that no manager
	// has seen at all has no Ready condition.
	SandboxReasonPending = "Pending"

	// SandboxReasonNodeAtCapacity: the Sandbox is pinned (spec.nodeName) to a
	// node whose manager is already running --max-sandboxes sandboxes.
	SandboxReasonNodeAtCapacity = "NodeAtCapacity"

	// SandboxReasonProvisioning: the manager has claimed the Sandbox and is
	// pulling the image or creating and starting the container.
	SandboxReasonProvisioning = "Provisioning"

	// SandboxReasonRunning: the container is running. Used with Ready=True.
	SandboxReasonRunning = "Running"

	// SandboxReasonImageNotFound: the image is not present on the node and
	// could not be pulled (or imagePullPolicy is Never). After a failed pull
	// the message names the failure class only ("ImagePullFailed: image not
	// found", "… unauthorized", "… registry unreachable", "… registry
	// refused", "… timed out"), never the registry's response.
	SandboxReasonImageNotFound = "ImageNotFound"

	// SandboxReasonImageRegistryNotAllowed: the image names a registry the
	// manager's registry policy refuses (loopback, private or link-local
	// addresses, localhost, and anything outside --allowed-registries).
	// Nothing was pulled; not retried.
	SandboxReasonImageRegistryNotAllowed = "ImageRegistryNotAllowed"

	// SandboxReasonRuntimeUnavailable: the requested runtime (for example
	// gvisor) is not configured in the node's Docker Engine.
	SandboxReasonRuntimeUnavailable = "RuntimeUnavailable"

	// SandboxReasonCreateFailed: Docker refused to create or start the
	// container for a reason other than the ones above; the message holds
	// Docker's error.
	SandboxReasonCreateFailed = "CreateFailed"

	// SandboxReasonContainerExited: the container's main process exited. The
	// message holds the exit code. Sandboxes are not restarted in place.
	SandboxReasonContainerExited = "ContainerExited"

	// SandboxReasonOOMKilled: the container was killed for exceeding
	// resources.memory.
	SandboxReasonOOMKilled = "OOMKilled"

	// SandboxReasonContainerMissing: the container disappeared behind the
	// manager's back (for example `docker rm -f`). It is recreated with
	// exponential backoff.
	SandboxReasonContainerMissing = "ContainerMissing"

	// SandboxReasonMultipleContainers: more than one container carries this
	// Sandbox's UID label, or a container that is not ours holds its name.
	// The manager fails closed and touches none of them until an operator
	// resolves it.
	SandboxReasonMultipleContainers = "MultipleContainers"

	// SandboxReasonDockerUnavailable: the node's Docker Engine did not answer
	// in time. The manager retries with backoff and keeps the finalizer until
	// the container is proven gone.
	SandboxReasonDockerUnavailable = "DockerUnavailable"

	// SandboxReasonExpired: activeDeadlineSeconds passed and the container
	// was removed. With spec.lifecycle.shutdownPolicy Delete the node
	// manager deletes the Sandbox right after.
	SandboxReasonExpired = "Expired"

	// SandboxReasonTerminating: the Sandbox is being deleted; the container is
	// being stopped and removed.
	SandboxReasonTerminating = "Terminating"

	// SandboxReasonPaused: spec.paused is true and the container is frozen
	// (the cgroup freezer). Used with Ready=False and Paused=True.
	SandboxReasonPaused = "Paused"

	// SandboxReasonHealthCheckFailed: a warm pool member's container runs but
	// failed the health check it must pass before it is frozen (the sandbox
	// user runs a command in the working directory and writes there and in
	// /tmp); the message says why. It is checked again with a backoff and is
	// not claimable meanwhile; its pool reports MembersFailing.
	SandboxReasonHealthCheckFailed = "HealthCheckFailed"

	// SandboxReasonResumed: spec.paused went back to false, or an exec or
	// file transfer arrived for an idle-paused sandbox, and the container
	// was thawed with its processes and files intact. Used with
	// Paused=False.
	SandboxReasonResumed = "Resumed"

	// SandboxReasonIdle: spec.lifecycle.idlePauseSeconds passed since the
	// last exec, file transfer or log read (status.lastActivityTime), and
	// the node manager froze the container. Used with Paused=True while
	// Ready stays True: the next exec or file transfer thaws it.
	SandboxReasonIdle = "Idle"

	// SandboxReasonWarmPoolClaimed: the Sandbox took over an idle member of
	// its warm pool. Used with WarmPoolClaim=True.
	SandboxReasonWarmPoolClaimed = "WarmPoolClaimed"

	// SandboxReasonWarmPoolEmpty: the warm pool had no idle member, so the
	// container was created from the pool's template. Used with
	// WarmPoolClaim=False.
	SandboxReasonWarmPoolEmpty = "WarmPoolEmpty"

	// SandboxReasonWarmPoolNotFound: spec.warmPoolRef names a
	// SandboxWarmPool that does not exist or is being deleted (nothing is
	// claimed from a pool being deleted). The Sandbox waits for it.
	SandboxReasonWarmPoolNotFound = "WarmPoolNotFound"

	// SandboxReasonClaimed: this Sandbox is a warm pool member whose
	// container another Sandbox took over; the pool controller deletes it.
	SandboxReasonClaimed = "Claimed"

	// SandboxReasonWarmPoolMemberInvalid: status.warmPool.member names a
	// container that is not a warm pool member of this Sandbox's namespace
	// on its node. The manager fails closed: it neither adopts, starts nor
	// removes that container.
	SandboxReasonWarmPoolMemberInvalid = "WarmPoolMemberInvalid"

	// SandboxReasonNodeLost: the node the Sandbox is bound to is gone: its
	// kubelet stopped renewing the node's Lease (or the Node was deleted)
	// and its manager's Lease expired too. Used with Ready=False, written by
	// the control plane (controllers/sandboxnode), and terminal, like a Pod
	// on a lost node: the Sandbox is never provisioned again, it no longer
	// counts against SandboxQuotas, a warm pool replaces such a member, and
	// nobody may change its status any more (config/policy). If the node
	// comes back, its manager removes the container; delete the Sandbox and
	// create a new one. Deletion completes whether or not the node returns
	// (docs/node-loss.md).
	SandboxReasonNodeLost = "NodeLost"
)

// IsNodeLost reports whether the Sandbox's node was declared lost
// (Ready=False with reason NodeLost), which is terminal.
func (s *Sandbox) IsNodeLost() bool {
	for i := range s.Status.Conditions {
		c := &s.Status.Conditions[i]
		if c.Type == string(SandboxConditionReady) {
			return c.Status == metav1.ConditionFalse && c.Reason == SandboxReasonNodeLost
		}
	}
	return false
}

// ImagePullPolicy says when the manager pulls the sandbox image.
// +kubebuilder:validation:Enum=IfNotPresent;Always;Never
type ImagePullPolicy string

const (
	PullIfNotPresent ImagePullPolicy = "IfNotPresent"
	PullAlways       ImagePullPolicy = "Always"
	PullNever        ImagePullPolicy = "Never"
)

// NetworkMode selects the sandbox's network access.
// +kubebuilder:validation:Enum=None;Egress
type NetworkMode string

const (
	// NetworkNone gives the sandbox only a loopback interface.
	NetworkNone NetworkMode = "None"
	// NetworkEgress attaches the sandbox to the project's own bridge network
	// (code-sandbox-egress, inter-container traffic off), whose firewall
	// rules, kept by the manager, let it reach the internet but not the
	// node, other sandboxes, private or link-local ranges (cloud metadata)
	// unless the manager's --egress-allow-cidr reopens them.
	NetworkEgress NetworkMode = "Egress"
)

// RuntimeClass selects the OCI runtime that runs the container.
// +kubebuilder:validation:Enum=runc;gvisor
type RuntimeClass string

const (
	RuntimeRunc   RuntimeClass = "runc"
	RuntimeGVisor RuntimeClass = "gvisor"
)

// ShutdownPolicy says what becomes of a Sandbox object once its
// activeDeadlineSeconds has passed.
// +kubebuilder:validation:Enum=Retain;Delete
type ShutdownPolicy string

const (
	// ShutdownRetain removes the container and keeps the Sandbox, which
	// reports Expired until someone deletes it.
	ShutdownRetain ShutdownPolicy = "Retain"
	// ShutdownDelete removes the container and then the Sandbox itself.
	ShutdownDelete ShutdownPolicy = "Delete"
)

// SandboxLifecycle says when a sandbox ends without anyone asking: after it
// was idle for a while, or when its lifetime passes. The node manager that
// runs the sandbox decides this (never an MCP server or another client), from
// the activity it serves itself: every exec, file transfer and log read
// through the node API counts. Idle time counts from status.lastActivityTime,
// or from the time the Sandbox became Ready when nothing has happened yet
// (for a Sandbox that claimed from a warm pool, from the claim). All fields
// may be changed while the Sandbox lives; a change applies from then on.
// +kubebuilder:validation:XValidation:rule="!has(self.idlePauseSeconds) || !has(self.idleDeleteSeconds) || self.idlePauseSeconds < self.idleDeleteSeconds",message="lifecycle.idlePauseSeconds must be less than lifecycle.idleDeleteSeconds: an idle sandbox is paused before it is deleted"
type SandboxLifecycle struct {
	// IdlePauseSeconds freezes the container (Paused=True, reason Idle)
	// after this many seconds with no exec, file transfer or log read. The
	// next exec or file transfer thaws it transparently and runs; log reads
	// do not thaw it. A Sandbox paused by spec.paused is not affected.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2592000
	// +optional
	IdlePauseSeconds *int64 `json:"idlePauseSeconds,omitempty"`

	// IdleDeleteSeconds deletes the Sandbox after this many seconds with no
	// exec, file transfer or log read, paused or not. Must be more than
	// idlePauseSeconds when both are set.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2592000
	// +optional
	IdleDeleteSeconds *int64 `json:"idleDeleteSeconds,omitempty"`

	// ShutdownPolicy is what happens to the Sandbox object when
	// activeDeadlineSeconds passes: Retain (default) removes the container
	// and keeps the object, which reports Expired; Delete removes the
	// container and then deletes the Sandbox.
	// +kubebuilder:default=Retain
	// +optional
	ShutdownPolicy ShutdownPolicy `json:"shutdownPolicy,omitempty"`
}

// SandboxResources bounds what a sandbox may consume. Every field has a safe
// default, so an empty resources block is already limited.
type SandboxResources struct {
	// CPU is the number of CPUs the sandbox may use (Docker NanoCPUs).
	// +kubebuilder:default="1"
	// +kubebuilder:validation:XValidation:rule="quantity(self).isGreaterThan(quantity('0'))",message="cpu must be greater than 0"
	// +kubebuilder:validation:XValidation:rule="quantity(self).compareTo(quantity('64')) <= 0",message="cpu must be at most 64"
	// +optional
	CPU *resource.Quantity `json:"cpu,omitempty"`

	// Memory is the memory limit. Swap is disabled (MemorySwap = Memory).
	// Files written to the sandbox's writable paths live in memory and count
	// against this limit too.
	// +kubebuilder:default="512Mi"
	// +kubebuilder:validation:XValidation:rule="quantity(self).compareTo(quantity('6Mi')) >= 0",message="memory must be at least 6Mi"
	// +kubebuilder:validation:XValidation:rule="quantity(self).compareTo(quantity('64Gi')) <= 0",message="memory must be at most 64Gi"
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`

	// Pids is the maximum number of processes and threads.
	// +kubebuilder:default=256
	// +kubebuilder:validation:Minimum=8
	// +kubebuilder:validation:Maximum=32768
	// +optional
	Pids *int64 `json:"pids,omitempty"`

	// Disk bounds every writable path (the working directory, /tmp, /var/tmp
	// and /dev/shm): each is a tmpfs of this size, and a single file may not
	// grow past it. Writes beyond it fail with ENOSPC; they never reach the
	// node's disk.
	// +kubebuilder:default="256Mi"
	// +kubebuilder:validation:XValidation:rule="quantity(self).compareTo(quantity('1Mi')) >= 0",message="disk must be at least 1Mi"
	// +kubebuilder:validation:XValidation:rule="quantity(self).compareTo(quantity('64Gi')) <= 0",message="disk must be at most 64Gi"
	// +optional
	Disk *resource.Quantity `json:"disk,omitempty"`
}

// SandboxNetwork configures network access.
// +kubebuilder:validation:XValidation:rule="!has(self.egress) || (has(self.mode) && self.mode == 'Egress')",message="network.egress needs network.mode Egress: a sandbox without a network reaches no host"
type SandboxNetwork struct {
	// Mode is None (default: loopback only) or Egress. Immutable on a
	// Sandbox.
	// +kubebuilder:default=None
	// +optional
	Mode NetworkMode `json:"mode,omitempty"`

	// Egress is the sandbox's egress policy: the host names it may reach,
	// through the node's egress proxy. Once it is set the sandbox reaches
	// exactly those names and nothing else (default deny; an empty allow
	// list reaches nothing). Without it, mode Egress keeps the unrestricted
	// behaviour (every public address), unless a SandboxQuota forbids that
	// (spec.egress). Unlike the rest of spec.network it may change while
	// the sandbox runs: the node manager hands the new policy to the proxy
	// within a second (status condition EgressPolicyApplied). It cannot be
	// added to or removed from an existing Sandbox: a sandbox keeps its
	// kind of egress, restricted or not. See docs/egress.md.
	// +optional
	Egress *EgressPolicy `json:"egress,omitempty"`
}

// Limits of an egress policy. Every manager and the webhook cache every
// Sandbox, so the policy is bounded like command and env.
const (
	// MaxEgressRules is the most entries spec.network.egress.allow holds.
	MaxEgressRules = 64
	// MaxEgressHostLength is the longest host name (DNS: 253).
	MaxEgressHostLength = 253
	// DefaultEgressPorts are the ports an egress rule without ports allows.
	DefaultEgressPort1 int32 = 80
	DefaultEgressPort2 int32 = 443
)

// DefaultEgressPorts returns the ports a rule without ports allows.
func DefaultEgressPorts() []int32 { return []int32{DefaultEgressPort1, DefaultEgressPort2} }

// EgressPolicy lists what a sandbox may reach. Anything not listed is
// refused by the node's egress proxy and resolver.
type EgressPolicy struct {
	// Allow are the hosts the sandbox may reach, each at most once.
	// +kubebuilder:validation:MaxItems=64
	// +listType=map
	// +listMapKey=host
	// +optional
	Allow []EgressRule `json:"allow,omitempty"`
}

// EgressRule allows one host name (or one wildcard of names).
// +kubebuilder:validation:XValidation:rule="!has(self.http) || has(self.inject)",message="http rules need inject: the proxy reads methods and paths only where it injects a credential (it terminates TLS there); other hosts pass through untouched"
// +kubebuilder:validation:XValidation:rule="!has(self.inject) || !self.host.startsWith('*.')",message="inject needs an exact host, not a wildcard: a credential goes to one named host"
type EgressRule struct {
	// Host is a DNS name in lower case without a trailing dot, for example
	// api.example.com, or a wildcard *.example.com, which matches every
	// name with one or more labels before example.com (a.example.com,
	// a.b.example.com) but not example.com itself. A wildcard needs at
	// least two labels after "*." (*.com is refused), and "*" may only be
	// the whole first label. IP addresses are refused: the proxy resolves
	// names itself, and a sandbox never picks an address.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == self.lowerAscii()",message="host must be lower case"
	// +kubebuilder:validation:XValidation:rule="!self.endsWith('.')",message="host must not end with a dot"
	// +kubebuilder:validation:XValidation:rule="self.matches('^([*][.])?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?[.])+[a-z]([-a-z0-9]{0,61}[a-z0-9])?$')",message="host must be a DNS name of two or more labels (letters, digits, '-'), optionally starting with '*.', whose last label starts with a letter (no IP addresses, no '*' elsewhere, no '*.' before a single label such as *.com)"
	// +required
	Host string `json:"host"`

	// Ports are the TCP ports allowed on the host; empty allows 80 and 443.
	// Port 53 is the proxy's own resolver and cannot be allowed.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Minimum=1
	// +kubebuilder:validation:items:Maximum=65535
	// +kubebuilder:validation:XValidation:rule="!self.exists(p, p == 53)",message="port 53 cannot be allowed: DNS goes to the node's egress resolver only"
	// +listType=set
	// +optional
	Ports []int32 `json:"ports,omitempty"`

	// HTTP narrows the requests allowed to the host by method and path. Only
	// with inject (see EgressRule).
	// +optional
	HTTP *EgressHTTPRule `json:"http,omitempty"`

	// Inject adds a header carrying a Secret's value to the requests the
	// proxy lets through to the host (matching http, if set). The value is
	// read by the node manager and held by the proxy in memory; it never
	// enters the sandbox.
	// +optional
	Inject *EgressInjection `json:"inject,omitempty"`
}

// EgressHTTPMethod is an HTTP method an egress rule allows.
// +kubebuilder:validation:Enum=GET;HEAD;POST;PUT;PATCH;DELETE;OPTIONS
type EgressHTTPMethod string

// EgressHTTPRule narrows requests by method and path.
type EgressHTTPRule struct {
	// Methods are the HTTP methods allowed; empty allows every method.
	// +kubebuilder:validation:MaxItems=7
	// +listType=set
	// +optional
	Methods []EgressHTTPMethod `json:"methods,omitempty"`

	// PathPrefixes are the URL path prefixes allowed, each starting with
	// '/'; empty allows every path. A prefix matches the cleaned path, so
	// /v1/../admin does not match /v1/.
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=256
	// +kubebuilder:validation:items:Pattern=`^/[!-~]*$`
	// +kubebuilder:validation:items:XValidation:rule="!self.contains('?') && !self.contains('#')",message="a path prefix has no query or fragment"
	// +listType=set
	// +optional
	PathPrefixes []string `json:"pathPrefixes,omitempty"`
}

// EgressInjection is a header the proxy adds to requests to one host.
type EgressInjection struct {
	// Header is the header's name, for example Authorization. A header of
	// the same name sent by the sandbox is replaced, never passed on.
	// Headers that steer the connection (Host, Connection, Content-Length,
	// Transfer-Encoding, …) are refused.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`
	// +kubebuilder:validation:XValidation:rule="!(self.lowerAscii() in ['host', 'connection', 'content-length', 'transfer-encoding', 'te', 'trailer', 'upgrade', 'keep-alive', 'proxy-connection', 'proxy-authorization', 'proxy-authenticate', 'expect'])",message="inject.header must not be a header that steers the connection (Host, Connection, Content-Length, Transfer-Encoding, TE, Trailer, Upgrade, Keep-Alive, Expect, Proxy-*)"
	// +required
	Header string `json:"header"`

	// SecretRef names the Secret, in the Sandbox's own namespace, and the
	// key whose value is the header's value. The Secret must carry the
	// label sandbox.code-sandbox.dev/egress-credential: "true": the node
	// managers read only such Secrets.
	// +required
	SecretRef EgressSecretKeyRef `json:"secretRef"`

	// ValuePrefix is written before the Secret's value, for example
	// "Bearer ".
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[ -~]*$`
	// +optional
	ValuePrefix string `json:"valuePrefix,omitempty"`
}

// EgressSecretKeyRef names a key of a Secret in the Sandbox's namespace.
type EgressSecretKeyRef struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +required
	Name string `json:"name"`

	// Key in the Secret's data.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +required
	Key string `json:"key"`
}

// LabelEgressCredential marks a Secret the node managers may read for
// egress credential injection. Managers see no other Secret.
const LabelEgressCredential = "sandbox.code-sandbox.dev/egress-credential"

// SandboxSpec is the desired state of a Sandbox. Everything but
// activeDeadlineSeconds, lifecycle and paused is fixed once the Sandbox exists, because a running
// container cannot take the change; create a new Sandbox instead.
// +kubebuilder:validation:XValidation:rule="has(self.image) || has(self.warmPoolRef)",message="spec.image is required unless spec.warmPoolRef names a SandboxWarmPool to claim from"
// +kubebuilder:validation:XValidation:rule="!(has(self.snapshotRef) && has(self.warmPoolRef))",message="spec.snapshotRef and spec.warmPoolRef are exclusive: a Sandbox restored from a snapshot starts a container of its own on the snapshot's node"
// +kubebuilder:validation:XValidation:rule="has(self.snapshotRef) == has(oldSelf.snapshotRef) && (!has(self.snapshotRef) || self.snapshotRef == oldSelf.snapshotRef)",message="snapshotRef is immutable"
// +kubebuilder:validation:XValidation:rule="!(has(self.image) && has(self.warmPoolRef))",message="spec.image must be empty when spec.warmPoolRef is set: the pool's template decides the image"
// +kubebuilder:validation:XValidation:rule="has(self.warmPoolRef) == has(oldSelf.warmPoolRef) && (!has(self.warmPoolRef) || self.warmPoolRef == oldSelf.warmPoolRef)",message="warmPoolRef is immutable"
// +kubebuilder:validation:XValidation:rule="has(self.command) == has(oldSelf.command) && (!has(self.command) || self.command == oldSelf.command)",message="command is immutable"
// +kubebuilder:validation:XValidation:rule="has(self.env) == has(oldSelf.env) && (!has(self.env) || self.env == oldSelf.env)",message="env is immutable"
// +kubebuilder:validation:XValidation:rule="has(self.nodeName) == has(oldSelf.nodeName) && (!has(self.nodeName) || self.nodeName == oldSelf.nodeName)",message="nodeName is immutable"
type SandboxSpec struct {
	// Image is the container image, for example python:3.12-slim-bookworm.
	// Required unless warmPoolRef is set.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^[^\s]+$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="image is immutable"
	// +optional
	Image string `json:"image,omitempty"`

	// WarmPoolRef claims the container from a SandboxWarmPool in the same
	// namespace instead of creating one: an idle member is unpaused and
	// handed over, or, when none is idle, a container is created from the
	// pool's template. The container's shape (image, command, workingDir,
	// user, resources, network, runtime) is the pool template's, and this
	// Sandbox's own values of those fields are ignored; env applies to
	// every exec, and activeDeadlineSeconds counts from the claim.
	// +optional
	WarmPoolRef *WarmPoolReference `json:"warmPoolRef,omitempty"`

	// SnapshotRef starts the Sandbox from a SandboxSnapshot of the same
	// namespace: it runs on the node that holds the snapshot, with the
	// snapshot's image by digest, and the snapshot's files are written into
	// its working directory, /tmp and /var/tmp before it is Ready
	// (condition SnapshotRestored). spec.image and spec.workingDir must be
	// the snapshot's source's. Processes and memory are not restored: the
	// Sandbox starts fresh. A snapshot of another namespace cannot be named
	// (no reference grant exists).
	// +optional
	SnapshotRef *SandboxSnapshotReference `json:"snapshotRef,omitempty"`

	// ImagePullPolicy is IfNotPresent (default), Always or Never.
	// +kubebuilder:default=IfNotPresent
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="imagePullPolicy is immutable"
	// +optional
	ImagePullPolicy ImagePullPolicy `json:"imagePullPolicy,omitempty"`

	// Command replaces the image's entrypoint and command. When it is empty
	// the sandbox runs a tiny idle process supplied by the manager, so it
	// stays up whatever the image's default command is, even in images
	// without a shell or sleep. At most 64 KiB in all: every manager and
	// the webhook cache every Sandbox, so big objects cost the whole fleet.
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:XValidation:rule="self.map(c, size(c)).sum() <= 65536",message="command must total at most 65536 bytes"
	// +listType=atomic
	// +optional
	Command []string `json:"command,omitempty"`

	// Env sets environment variables in the sandbox; names and values
	// total at most 64 KiB (see Command).
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:XValidation:rule="self.map(e, size(e.name) + (has(e.value) ? size(e.value) : 0)).sum() <= 65536",message="env names and values must total at most 65536 bytes"
	// +listType=map
	// +listMapKey=name
	// +optional
	Env []EnvVar `json:"env,omitempty"`

	// WorkingDir is the absolute path where commands start. It is a writable
	// tmpfs bounded by resources.disk.
	// +kubebuilder:default="/app"
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self.startsWith('/')",message="workingDir must be an absolute path"
	// +kubebuilder:validation:XValidation:rule="!self.split('/').exists(p, p == '..' || p == '.')",message="workingDir must not contain '.' or '..' segments"
	// +kubebuilder:validation:XValidation:rule="!(self in ['/', '/proc', '/sys', '/dev', '/etc', '/tmp', '/var/tmp', '/dev/shm']) && !self.startsWith('/proc/') && !self.startsWith('/sys/') && !self.startsWith('/dev/')",message="workingDir must not be /, /etc, /tmp, /var/tmp or a path under /proc, /sys or /dev"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="workingDir is immutable"
	// +optional
	WorkingDir string `json:"workingDir,omitempty"`

	// User is the uid[:gid] the sandbox runs as. It defaults to nobody
	// (65534:65534). Root (0) is refused: sandboxes never run as root.
	// +kubebuilder:default="65534:65534"
	// +kubebuilder:validation:Pattern=`^[0-9]{1,10}(:[0-9]{1,10})?$`
	// +kubebuilder:validation:XValidation:rule="self.split(':')[0] != '0' && !self.split(':')[0].matches('^0+$')",message="user must not be root (uid 0)"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="user is immutable"
	// +optional
	User string `json:"user,omitempty"`

	// Resources bounds CPU, memory, processes and disk.
	// +kubebuilder:default={}
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="resources are immutable"
	// +optional
	Resources SandboxResources `json:"resources,omitempty"`

	// Network configures network access. The default is no network. The
	// mode is immutable; the egress policy may change (see
	// SandboxNetwork.Egress).
	// +kubebuilder:default={}
	// +kubebuilder:validation:XValidation:rule="(has(self.mode) ? self.mode : 'None') == (has(oldSelf.mode) ? oldSelf.mode : 'None')",message="network.mode is immutable"
	// +kubebuilder:validation:XValidation:rule="has(self.egress) == has(oldSelf.egress)",message="network.egress may be changed but not added or removed on an existing Sandbox: that would turn restricted egress into unrestricted or back"
	// +optional
	Network SandboxNetwork `json:"network,omitempty"`

	// Runtime is runc (default) or gvisor (Docker runtime runsc).
	// +kubebuilder:default=runc
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="runtime is immutable"
	// +optional
	Runtime RuntimeClass `json:"runtime,omitempty"`

	// ActiveDeadlineSeconds is the sandbox's lifetime, counted from
	// status.startTime. When it passes, the container is removed and the
	// Sandbox reports Expired. It may be changed while the Sandbox lives.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2592000
	// +optional
	ActiveDeadlineSeconds *int64 `json:"activeDeadlineSeconds,omitempty"`

	// Lifecycle ends an idle sandbox (pause, then delete) and says whether
	// the Sandbox deletes itself when activeDeadlineSeconds passes. Without
	// it a sandbox never idles out and an expired Sandbox is kept. It is not
	// part of a warm pool's template: a Sandbox that claims from a pool uses
	// its own, counted from the claim, and pool members never idle out.
	// +optional
	Lifecycle *SandboxLifecycle `json:"lifecycle,omitempty"`

	// Paused freezes the sandbox's container while true: its processes get
	// no CPU time and keep their memory, files and network state. Exec and
	// file transfers are refused meanwhile (Ready=False, reason Paused);
	// setting it back to false resumes the sandbox where it stopped. A
	// paused sandbox still counts against its quota and its node's capacity,
	// and its lifetime (activeDeadlineSeconds) keeps running. It may be
	// changed while the Sandbox lives.
	// +optional
	Paused bool `json:"paused,omitempty"`

	// NodeName pins the Sandbox to one node. When it is empty, the first
	// manager with spare capacity claims the Sandbox.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +optional
	NodeName string `json:"nodeName,omitempty"`
}

// EnvVar is an environment variable for the sandbox.
type EnvVar struct {
	// Name of the variable.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_]*$`
	// +required
	Name string `json:"name"`

	// Value of the variable.
	// +kubebuilder:validation:MaxLength=32768
	// +optional
	Value string `json:"value,omitempty"`
}

// SandboxStatus is the observed state of a Sandbox.
type SandboxStatus struct {
	// Conditions: Ready; Paused once spec.paused has been set; Expired once
	// the lifetime has passed.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// NodeName is the node whose manager claimed and runs the Sandbox.
	// +optional
	NodeName string `json:"nodeName,omitempty"`

	// ContainerID is the Docker container's ID.
	// +optional
	ContainerID string `json:"containerID,omitempty"`

	// StartTime is when the container first started. activeDeadlineSeconds
	// counts from here.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`

	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// NodeAPIEndpoint is the address of the node API that serves this
	// Sandbox's exec, files, log and history subresources, as
	// https://HOST:PORT. Only the operator's aggregated API server connects
	// to it, and it trusts the address only as far as the certificate there
	// chains to the operator CA and names status.nodeName; users reach the
	// subresources through the API server
	// (/apis/subresources.sandbox.code-sandbox.dev/v1alpha1/...). The node's
	// manager sets it once it has claimed the Sandbox.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	NodeAPIEndpoint string `json:"nodeAPIEndpoint,omitempty"`

	// WarmPool records how a Sandbox with spec.warmPoolRef got its
	// container: the member it took over, or a cold start, and the template
	// it was made from.
	// +optional
	WarmPool *SandboxWarmPoolClaimStatus `json:"warmPool,omitempty"`

	// LastActivityTime is the last exec, file transfer or log read the node
	// API served for this Sandbox, as far as the node manager has recorded
	// it: it writes it at most every 30 seconds while there is activity,
	// and always before acting on spec.lifecycle, so that a manager restart
	// neither resets nor loses the idle clock. Empty until the first
	// activity. Only the node manager may write it (config/policy).
	// +optional
	LastActivityTime *metav1.Time `json:"lastActivityTime,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=sbx,categories=all
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Image",type=string,JSONPath=`.spec.image`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.nodeName`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// Sandbox is a disposable, hardened Docker container for running untrusted
// code, provisioned by the manager on one node.
type Sandbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec SandboxSpec `json:"spec"`
	// +optional
	Status SandboxStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// SandboxList contains a list of Sandbox.
type SandboxList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Sandbox `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Sandbox{}, &SandboxList{})
}
