package session

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// OpSnapshot is taking a snapshot of a sandbox; a fork is OpSnapshot of
// its source (when it names a sandbox) and OpCreate of each child.
const OpSnapshot Op = "snapshot"

// SnapshotDriver is a Driver that snapshots its sandboxes. It keeps the
// snapshots, by owner: a snapshot of one caller is never found for another.
type SnapshotDriver interface {
	// Snapshot takes and keeps a snapshot of h's sandbox, owned by h.Caller.
	Snapshot(ctx context.Context, h Handle) (contract.Snapshot, error)
	// GetSnapshot returns owner's snapshot id (contract.ErrSnapshotNotFound).
	GetSnapshot(ctx context.Context, owner contract.Caller, id string) (contract.Snapshot, error)
	// Restore writes owner's snapshot id into h's sandbox, a new one.
	Restore(ctx context.Context, h Handle, id string) error
	ListSnapshots(ctx context.Context, owner contract.Caller) ([]contract.Snapshot, error)
	DeleteSnapshot(ctx context.Context, owner contract.Caller, id string) error
}

var _ contract.SnapshotBackend = (*Manager)(nil)

// SnapshotsSupported implements contract.SnapshotBackend.
func (m *Manager) SnapshotsSupported() bool {
	_, ok := m.d.(SnapshotDriver)
	return ok
}

func (m *Manager) snapshotDriver() (SnapshotDriver, error) {
	sd, ok := m.d.(SnapshotDriver)
	if !ok {
		return nil, fmt.Errorf("%w: this backend cannot snapshot sandboxes", contract.ErrInvalid)
	}
	return sd, nil
}

// Snapshot implements contract.SnapshotBackend.
func (m *Manager) Snapshot(ctx context.Context, caller contract.Caller, id string) (contract.Snapshot, error) {
	sd, err := m.snapshotDriver()
	if err != nil {
		return contract.Snapshot{}, err
	}
	e, h, release, err := m.openRunning(ctx, caller, OpSnapshot, id)
	if err != nil {
		return contract.Snapshot{}, err
	}
	defer release()
	snap, err := sd.Snapshot(ctx, h)
	m.done(e, err)
	return snap, err
}

// Fork implements contract.SnapshotBackend. The children are created as
// sandbox_initialize would create them with the source's settings (so each
// counts against MaxSandboxes and is fresh: own hostname, processes and
// memory), then the snapshot is written into each. A fork from a sandbox
// takes a snapshot for it and deletes it after.
func (m *Manager) Fork(ctx context.Context, caller contract.Caller, req contract.ForkRequest) ([]contract.Sandbox, error) {
	if err := req.Check(); err != nil {
		return nil, err
	}
	sd, err := m.snapshotDriver()
	if err != nil {
		return nil, err
	}
	var snap contract.Snapshot
	if req.ContainerID != "" {
		if snap, err = m.Snapshot(ctx, caller, req.ContainerID); err != nil {
			return nil, err
		}
		defer func() {
			if err := sd.DeleteSnapshot(context.WithoutCancel(ctx), caller, snap.ID); err != nil {
				m.log.Warn("deleting a fork's snapshot", "snapshot", snap.ID, "error", err)
			}
		}()
	} else if snap, err = sd.GetSnapshot(ctx, caller, req.SnapshotID); err != nil {
		return nil, err
	}
	create := contract.CreateRequest{Image: snap.Image, NanoCPUs: snap.NanoCPUs, MemoryBytes: snap.MemoryBytes, Network: snap.Network}
	kids := make([]contract.Sandbox, req.Count)
	errs := make([]error, req.Count)
	var wg sync.WaitGroup
	for i := range req.Count {
		wg.Go(func() {
			sb, err := m.Create(ctx, caller, create)
			if err != nil {
				errs[i] = err
				return
			}
			kids[i] = sb
			e, h, release, err := m.openRunning(ctx, caller, OpUpload, sb.ID)
			if err != nil {
				errs[i] = err
				return
			}
			err = sd.Restore(ctx, h, snap.ID)
			release()
			m.done(e, err)
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, k := range kids {
			if k.ID != "" {
				if serr := m.Stop(context.WithoutCancel(ctx), caller, k.ID); serr != nil {
					m.log.Warn("removing a failed fork's child", "sandbox", k.ID, "error", serr)
				}
			}
		}
		return nil, fmt.Errorf("forking %d sandboxes: %w", req.Count, errs[firstErr(errs)])
	}
	return kids, nil
}

func firstErr(errs []error) int {
	for i, err := range errs {
		if err != nil {
			return i
		}
	}
	return 0
}

// ListSnapshots implements contract.SnapshotBackend.
func (m *Manager) ListSnapshots(ctx context.Context, caller contract.Caller) ([]contract.Snapshot, error) {
	sd, err := m.snapshotDriver()
	if err != nil {
		return nil, err
	}
	if err := m.authorize(ctx, caller, OpList, ""); err != nil {
		return nil, err
	}
	return sd.ListSnapshots(ctx, caller)
}

// DeleteSnapshot implements contract.SnapshotBackend.
func (m *Manager) DeleteSnapshot(ctx context.Context, caller contract.Caller, id string) error {
	sd, err := m.snapshotDriver()
	if err != nil {
		return err
	}
	if err := m.authorize(ctx, caller, OpStop, ""); err != nil {
		return err
	}
	return sd.DeleteSnapshot(ctx, caller, id)
}
