package contract

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// MaxForkCount bounds the sandboxes one sandbox_fork makes.
const MaxForkCount = 16

// Snapshot is what a caller may know about one of its snapshots: the files
// of a sandbox's writable paths (working directory, /tmp, /var/tmp) and
// the settings that shaped it. Processes and memory are not in it.
type Snapshot struct {
	ID string `json:"snapshot_id"`
	// SourceID is the sandbox it was taken of (container_id).
	SourceID    string    `json:"source_container_id"`
	Image       string    `json:"image"`
	Network     string    `json:"network"`
	NanoCPUs    int64     `json:"nano_cpus"`
	MemoryBytes int64     `json:"memory_bytes"`
	Files       int       `json:"files"`
	Bytes       int64     `json:"bytes"`
	CreatedAt   time.Time `json:"created_at"`
}

// ForkRequest asks for Count new sandboxes holding the files of the
// sandbox ContainerID (snapshotted for the fork) or of the snapshot
// SnapshotID: exactly one of the two.
type ForkRequest struct {
	ContainerID string
	SnapshotID  string
	Count       int
}

// Check validates r.
func (r ForkRequest) Check() error {
	switch {
	case (r.ContainerID == "") == (r.SnapshotID == ""):
		return fmt.Errorf("%w: give exactly one of container_id and snapshot_id", ErrInvalid)
	case r.Count < 1 || r.Count > MaxForkCount:
		return fmt.Errorf("%w: count %d is out of range: 1 to %d", ErrInvalid, r.Count, MaxForkCount)
	}
	return nil
}

// ErrSnapshotNotFound: no snapshot of the caller has that ID. Another
// caller's snapshot is reported exactly like one that never existed.
var ErrSnapshotNotFound = errors.New("snapshot not found")

// SnapshotBackend is a Backend that snapshots and forks sandboxes.
type SnapshotBackend interface {
	// SnapshotsSupported says whether the backend's sandboxes can be
	// snapshotted at all.
	SnapshotsSupported() bool
	// Snapshot takes a snapshot of the caller's sandbox id.
	Snapshot(ctx context.Context, caller Caller, id string) (Snapshot, error)
	// Fork makes req.Count new sandboxes of the caller with the files of
	// the sandbox or snapshot req names. On failure none is left.
	Fork(ctx context.Context, caller Caller, req ForkRequest) ([]Sandbox, error)
	// ListSnapshots lists the caller's snapshots, oldest first.
	ListSnapshots(ctx context.Context, caller Caller) ([]Snapshot, error)
	// DeleteSnapshot removes the caller's snapshot and its data.
	DeleteSnapshot(ctx context.Context, caller Caller, id string) error
}
