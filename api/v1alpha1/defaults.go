/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package v1alpha1

import "time"

// The defaults of a Sandbox's spec (and of a SandboxWarmPool's template),
// written once. The +kubebuilder:default markers cannot name a Go constant,
// so they repeat these values; defaults_test.go reads the generated CRDs
// and fails when a marker and its constant disagree, and the Docker
// runtime's own defaults (internal/dockerruntime, which knows no Kubernetes
// types) are held to these by a test there. Code that meets a Sandbox stored
// before a default existed falls back to these constants.
const (
	DefaultImagePullPolicy = PullIfNotPresent
	// DefaultWorkingDir is the writable working directory (a tmpfs).
	DefaultWorkingDir = "/app"
	// DefaultUser is nobody: sandboxes never run as root.
	DefaultUser        = "65534:65534"
	DefaultNetworkMode = NetworkNone
	DefaultRuntime     = RuntimeRunc

	// DefaultCPU is spec.resources.cpu, a quantity in cores.
	DefaultCPU = "1"
	// DefaultMemory is spec.resources.memory; swap is off.
	DefaultMemory = "512Mi"
	// DefaultDisk is spec.resources.disk, the size of each writable path.
	DefaultDisk = "256Mi"
	// DefaultPids is spec.resources.pids.
	DefaultPids int64 = 256

	// The same in the units the container runtime takes.
	DefaultNanoCPUs    int64 = 1_000_000_000
	DefaultMemoryBytes int64 = 512 << 20
	DefaultDiskBytes   int64 = 256 << 20

	// DefaultShutdownPolicy is spec.lifecycle.shutdownPolicy (when
	// spec.lifecycle is set; no lifecycle means the same).
	DefaultShutdownPolicy = ShutdownRetain

	// DefaultWarmPoolReplicas is a SandboxWarmPool's spec.replicas.
	DefaultWarmPoolReplicas int32 = 1

	// DefaultStopGracePeriod is the time between SIGTERM and SIGKILL when a
	// sandbox's container is removed: the manager's --stop-grace-period
	// default and the MCP server's Docker backend's. It is not a field of
	// the spec (a Sandbox cannot choose how long its node waits for it), so
	// no CRD default repeats it.
	DefaultStopGracePeriod = 10 * time.Second
)
