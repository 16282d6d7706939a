package contract

import (
	"context"
	"time"
)

// Metrics is one reading of a sandbox's resource use against its limits,
// measured at the time of the call (sandbox_metrics). Byte counts are
// bytes; a zero limit means none.
type Metrics struct {
	ContainerID string    `json:"container_id"`
	Time        time.Time `json:"time"`
	// Paused: the sandbox is frozen (idle pause or spec.paused); reading
	// its metrics did not wake it.
	Paused            bool    `json:"paused"`
	CPUCores          float64 `json:"cpu_cores"`
	CPULimitCores     float64 `json:"cpu_limit_cores"`
	CPUPercentOfLimit float64 `json:"cpu_percent_of_limit"`
	MemoryBytes       int64   `json:"memory_bytes"`
	MemoryLimitBytes  int64   `json:"memory_limit_bytes"`
	Pids              int64   `json:"pids"`
	PidsLimit         int64   `json:"pids_limit"`
	// DiskUsedBytes is the bytes in all writable paths together (they are
	// tmpfs, counted in the sandbox's memory cgroup); each path has its
	// own limit, and its own use where it could be read without waking the
	// sandbox (PathsSource).
	DiskUsedBytes int64       `json:"disk_used_bytes"`
	WritablePaths []PathLimit `json:"writable_paths"`
	// PathsSource: host-statfs, helper-statfs or unavailable.
	PathsSource string        `json:"paths_source,omitempty"`
	Network     *NetworkBytes `json:"network,omitempty"`
}

// PathLimit is a writable path and its size limit.
type PathLimit struct {
	Path       string `json:"path"`
	LimitBytes int64  `json:"limit_bytes"`
	// UsedBytes is absent when the path's use could not be read without
	// waking the sandbox.
	UsedBytes *int64 `json:"used_bytes,omitempty"`
}

// NetworkBytes is the traffic of a sandbox with network access since it
// started.
type NetworkBytes struct {
	RxBytes int64 `json:"rx_bytes"`
	TxBytes int64 `json:"tx_bytes"`
}

// MetricsBackend is a Backend that reads its sandboxes' resource use. A
// reading never wakes a paused sandbox and does not count as its use.
type MetricsBackend interface {
	Metrics(ctx context.Context, caller Caller, id string) (Metrics, error)
}
