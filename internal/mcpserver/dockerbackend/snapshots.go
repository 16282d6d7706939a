package dockerbackend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/session"
	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
	"github.com/code-sandbox/code-sandbox-operator/internal/snapshotstore"
)

// Snapshots on the Docker backend are tar files of a sandbox's writable
// paths (dockerruntime.Snapshot), kept in a directory of this server run:
// <dir>/<owner>/<id>.tar with <id>.json beside it. The owner is the
// caller's IdentityHash, so one caller's snapshot is never found for
// another; the ID is random, never a path the caller chose. The directory
// is removed by Close: like the sandboxes, snapshots last one server run.

// DefaultMaxSnapshots bounds the snapshots one identity may keep.
const DefaultMaxSnapshots = 16

// snapshotMaxBytes bounds the file content of one snapshot: the three
// writable paths at their default disk limit.
const snapshotMaxBytes = 3 * dockerruntime.DefaultDiskBytes

// snapshotMaxEntries bounds the entries a restore writes.
const snapshotMaxEntries = 100000

var snapshotIDPattern = regexp.MustCompile(`^snap-[0-9a-f]{16}$`)

type snapshotStore struct {
	mu  sync.Mutex
	dir string
	max int
}

var _ session.SnapshotDriver = (*driver)(nil)

func (b *driver) snapshots() (*snapshotStore, error) {
	b.snapMu.Lock()
	defer b.snapMu.Unlock()
	if b.snaps != nil {
		return b.snaps, nil
	}
	parent := b.opts.SnapshotDir
	if parent == "" {
		parent = os.TempDir()
	}
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return nil, fmt.Errorf("creating the snapshot directory: %w", err)
	}
	dir, err := os.MkdirTemp(parent, "code-sandbox-mcp-snapshots-")
	if err != nil {
		return nil, fmt.Errorf("creating the snapshot directory: %w", err)
	}
	maxN := b.opts.MaxSnapshots
	if maxN <= 0 {
		maxN = DefaultMaxSnapshots
	}
	b.snaps = &snapshotStore{dir: dir, max: maxN}
	return b.snaps, nil
}

// closeSnapshots removes every snapshot of this run.
func (b *driver) closeSnapshots() {
	b.snapMu.Lock()
	defer b.snapMu.Unlock()
	if b.snaps != nil {
		if st := b.opts.SnapshotStore; st != nil {
			refs, _ := filepath.Glob(filepath.Join(b.snaps.dir, "*", "snap-*.ref"))
			for _, p := range refs {
				if ref, err := os.ReadFile(p); err == nil {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					if err := st.Delete(ctx, string(ref)); err != nil {
						b.log.Warn("deleting a stored snapshot", "ref", string(ref), "error", err)
					}
					cancel()
				}
			}
		}
		if err := os.RemoveAll(b.snaps.dir); err != nil {
			b.log.Warn("removing the snapshot directory", "dir", b.snaps.dir, "error", err)
		}
		b.snaps = nil
	}
}

func (s *snapshotStore) ownerDir(owner contract.Caller) string {
	return filepath.Join(s.dir, contract.IdentityHash(owner.ID))
}

func (s *snapshotStore) paths(owner contract.Caller, id string) (tarPath, metaPath string, err error) {
	if !snapshotIDPattern.MatchString(id) {
		return "", "", fmt.Errorf("%w: snapshot_id %q is not a snapshot ID (snap- and 16 hex digits)", contract.ErrInvalid, id)
	}
	d := s.ownerDir(owner)
	return filepath.Join(d, id+".tar"), filepath.Join(d, id+".json"), nil
}

func (s *snapshotStore) list(owner contract.Caller) ([]contract.Snapshot, error) {
	entries, err := os.ReadDir(s.ownerDir(owner))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing snapshots: %w", err)
	}
	var out []contract.Snapshot
	for _, e := range entries {
		if filepath.Ext(e.Name()) != ".json" {
			continue
		}
		snap, err := s.get(owner, e.Name()[:len(e.Name())-len(".json")])
		if err == nil {
			out = append(out, snap)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

func (s *snapshotStore) get(owner contract.Caller, id string) (contract.Snapshot, error) {
	_, metaPath, err := s.paths(owner, id)
	if err != nil {
		return contract.Snapshot{}, err
	}
	data, err := os.ReadFile(metaPath)
	if errors.Is(err, os.ErrNotExist) {
		return contract.Snapshot{}, fmt.Errorf("%w: %q", contract.ErrSnapshotNotFound, id)
	}
	if err != nil {
		return contract.Snapshot{}, fmt.Errorf("reading snapshot %s: %w", id, err)
	}
	var snap contract.Snapshot
	if err := json.Unmarshal(data, &snap); err != nil {
		return contract.Snapshot{}, fmt.Errorf("reading snapshot %s: %w", id, err)
	}
	return snap, nil
}

// Snapshot implements session.SnapshotDriver.
func (b *driver) Snapshot(ctx context.Context, h session.Handle) (contract.Snapshot, error) {
	s, err := b.snapshots()
	if err != nil {
		return contract.Snapshot{}, err
	}
	if err := b.thawed(ctx, h); err != nil {
		return contract.Snapshot{}, err
	}
	id := "snap-" + randid.Hex(8)
	tarPath, metaPath, err := s.paths(h.Caller, id)
	if err != nil {
		return contract.Snapshot{}, err
	}
	// The count is checked and the ID reserved under the lock, so two
	// snapshots at once cannot both take the last place.
	s.mu.Lock()
	have, err := s.list(h.Caller)
	if err == nil && len(have) >= s.max {
		err = fmt.Errorf("%w: %d snapshots kept, the most one caller may keep is %d; delete_snapshot one first", contract.ErrQuota, len(have), s.max)
	}
	if err == nil {
		err = os.MkdirAll(filepath.Dir(tarPath), 0o700)
	}
	var f *os.File
	if err == nil {
		f, err = os.OpenFile(tarPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	}
	if err == nil {
		// A placeholder record counts the snapshot until it is written.
		err = writeJSON(metaPath, contract.Snapshot{ID: id, SourceID: h.ID, CreatedAt: time.Now().UTC()})
	}
	s.mu.Unlock()
	if err != nil {
		if f != nil {
			f.Close()
			os.Remove(tarPath)
		}
		return contract.Snapshot{}, err
	}
	fail := func(err error) (contract.Snapshot, error) {
		f.Close()
		os.Remove(tarPath)
		os.Remove(metaPath)
		return contract.Snapshot{}, err
	}
	stats, err := b.docker.Snapshot(ctx, h.Ref, dockerruntime.SnapshotRoots(h.Sandbox.WorkingDir), f, snapshotMaxBytes)
	if errors.Is(err, dockerruntime.ErrNotFound) {
		return fail(session.Gone(mapErr(err)))
	}
	if err != nil {
		return fail(mapErr(err))
	}
	if err := f.Close(); err != nil {
		return fail(fmt.Errorf("writing snapshot %s: %w", id, err))
	}
	if st := b.opts.SnapshotStore; st != nil {
		// The tar goes to the store; the record keeps only its ref.
		ref, err := storeSnapshot(ctx, st, "mcp/"+contract.IdentityHash(h.Caller.ID)+"/"+id, tarPath)
		if err == nil {
			err = os.WriteFile(refPath(tarPath), []byte(ref), 0o600)
			if err != nil {
				_ = st.Delete(context.WithoutCancel(ctx), ref)
			}
		}
		if err != nil {
			os.Remove(refPath(tarPath))
			return fail(fmt.Errorf("storing snapshot %s: %w", id, err))
		}
		os.Remove(tarPath)
	}
	snap := contract.Snapshot{
		ID: id, SourceID: h.ID, Image: h.Sandbox.Image, Network: h.Sandbox.Network,
		NanoCPUs: h.Sandbox.NanoCPUs, MemoryBytes: h.Sandbox.MemoryBytes,
		Files: stats.Files, Bytes: stats.Bytes, CreatedAt: time.Now().UTC(),
	}
	if err := writeJSON(metaPath, snap); err != nil {
		return fail(err)
	}
	b.log.Info("snapshot taken", "snapshot", id, "sandbox", h.ID, "files", stats.Files, "bytes", stats.Bytes, "owner", contract.IdentityHash(h.Caller.ID))
	return snap, nil
}

// refPath is where a snapshot's store ref is kept, beside its record.
func refPath(tarPath string) string { return strings.TrimSuffix(tarPath, ".tar") + ".ref" }

func storeSnapshot(ctx context.Context, st snapshotstore.Store, key, tarPath string) (string, error) {
	f, err := os.Open(tarPath)
	if err != nil {
		return "", err
	}
	defer f.Close()
	ref, _, err := st.Put(ctx, strings.ToLower(key), f)
	return ref, err
}

// openSnapshot opens a snapshot's tar: from the store when it went there.
func (b *driver) openSnapshot(ctx context.Context, tarPath string) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) {
		if st := b.opts.SnapshotStore; st != nil {
			if ref, err := os.ReadFile(refPath(tarPath)); err == nil {
				return st.Open(ctx, string(ref))
			}
		}
		return os.Open(tarPath)
	}
}

func writeJSON(p string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", filepath.Base(p), err)
	}
	return os.Rename(tmp, p)
}

// GetSnapshot implements session.SnapshotDriver.
func (b *driver) GetSnapshot(_ context.Context, owner contract.Caller, id string) (contract.Snapshot, error) {
	s, err := b.snapshots()
	if err != nil {
		return contract.Snapshot{}, err
	}
	snap, err := s.get(owner, id)
	if err == nil && snap.Image == "" {
		return contract.Snapshot{}, fmt.Errorf("%w: %q is still being taken", contract.ErrSnapshotNotFound, id)
	}
	return snap, err
}

// Restore implements session.SnapshotDriver.
func (b *driver) Restore(ctx context.Context, h session.Handle, id string) error {
	s, err := b.snapshots()
	if err != nil {
		return err
	}
	if _, err := b.GetSnapshot(ctx, h.Caller, id); err != nil {
		return err
	}
	tarPath, _, _ := s.paths(h.Caller, id)
	b.restoring.Add(1)
	defer b.restoring.Add(-1)
	if err := b.thawed(ctx, h); err != nil {
		return err
	}
	open := b.openSnapshot(ctx, tarPath)
	_, err = b.docker.Restore(ctx, h.Ref, dockerruntime.SnapshotRoots(h.Sandbox.WorkingDir), open,
		execio.UploadLimits{MaxBytes: snapshotMaxBytes, MaxEntries: snapshotMaxEntries})
	return mapErr(err)
}

// ListSnapshots implements session.SnapshotDriver.
func (b *driver) ListSnapshots(_ context.Context, owner contract.Caller) ([]contract.Snapshot, error) {
	s, err := b.snapshots()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	all, err := s.list(owner)
	out := all[:0]
	for _, snap := range all {
		if snap.Image != "" {
			out = append(out, snap)
		}
	}
	return out, err
}

// DeleteSnapshot implements session.SnapshotDriver.
func (b *driver) DeleteSnapshot(ctx context.Context, owner contract.Caller, id string) error {
	s, err := b.snapshots()
	if err != nil {
		return err
	}
	tarPath, metaPath, err := s.paths(owner, id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.Remove(metaPath); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: %q", contract.ErrSnapshotNotFound, id)
	} else if err != nil {
		return fmt.Errorf("deleting snapshot %s: %w", id, err)
	}
	if err := os.Remove(tarPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("deleting snapshot %s: %w", id, err)
	}
	if ref, err := os.ReadFile(refPath(tarPath)); err == nil && b.opts.SnapshotStore != nil {
		if err := b.opts.SnapshotStore.Delete(ctx, string(ref)); err != nil {
			return fmt.Errorf("deleting snapshot %s from its store: %w", id, err)
		}
		os.Remove(refPath(tarPath))
	}
	return nil
}
