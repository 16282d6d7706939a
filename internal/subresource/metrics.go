/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package subresource

import "time"

// The metrics subresource: GET .../sandboxes/{name}/metrics answers one
// Metrics (JSON), measured at the time of the call. RBAC: get
// sandboxes/metrics. It is read on the host side (the container's cgroup,
// through Docker's stats API), so it never wakes a paused Sandbox and is
// not refused for one; it is not activity for spec.lifecycle's idle
// timeouts either, so polling it does not keep a Sandbox awake.
const SubresourceMetrics = "metrics"

// MetricsVersion is Metrics.Version: a change that is not an added
// optional field gets a new version.
const MetricsVersion = "metrics.v1"

// Metrics is one reading of a Sandbox's resource use against its limits.
// Byte counts are bytes; a zero limit means none.
type Metrics struct {
	Version   string    `json:"version"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	Node      string    `json:"node"`
	Time      time.Time `json:"time"`
	// Paused: the cgroup freezer holds the container (spec.paused or an
	// idle pause); its CPU use is zero and the reading did not wake it.
	Paused bool `json:"paused"`

	CPU     CPUMetrics      `json:"cpu"`
	Memory  UsageMetrics    `json:"memory"`
	Pids    UsageMetrics    `json:"pids"`
	Disk    DiskMetrics     `json:"disk"`
	Network *NetworkMetrics `json:"network,omitempty"`
}

// CPUMetrics is the CPU used over about a second before the reply.
type CPUMetrics struct {
	Cores      float64 `json:"cores"`
	LimitCores float64 `json:"limitCores"`
	// PercentOfLimit is 100*Cores/LimitCores (0 without a limit).
	PercentOfLimit float64 `json:"percentOfLimit"`
}

// UsageMetrics is a count against its limit.
type UsageMetrics struct {
	Used  int64 `json:"used"`
	Limit int64 `json:"limit"`
}

// DiskMetrics is the writable paths (tmpfs: the working directory, /tmp,
// /var/tmp), each with its own size limit. Their pages are memory of the
// Sandbox's cgroup, counted there on the host side for all paths together
// (UsedBytes, which also counts /dev/shm); the cgroup does not split it by
// path. Reading each path's own use would mean running a statfs inside
// the container, which a paused container cannot do without waking.
type DiskMetrics struct {
	UsedBytes int64 `json:"usedBytes"`
	// Source says how UsedBytes was read (cgroup-shmem on cgroup v2,
	// cgroup-v1-cache-minus-file on cgroup v1).
	Source string        `json:"source,omitempty"`
	Paths  []PathMetrics `json:"paths"`
	// PathsSource says how each path's UsedBytes was read: host-statfs,
	// helper-statfs (a running sandbox only) or unavailable (a paused
	// sandbox seen from the manager's pod). See docs/metrics.md.
	PathsSource string `json:"pathsSource,omitempty"`
}

// PathMetrics is one writable path and its size limit.
type PathMetrics struct {
	Path       string `json:"path"`
	LimitBytes int64  `json:"limitBytes"`
	// UsedBytes is the bytes used in this path; absent when it could not
	// be read without waking the sandbox.
	UsedBytes *int64 `json:"usedBytes,omitempty"`
}

// NetworkMetrics is the bytes through the Sandbox's network interfaces
// since its container started; only Egress Sandboxes have one.
type NetworkMetrics struct {
	RxBytes int64 `json:"rxBytes"`
	TxBytes int64 `json:"txBytes"`
}
