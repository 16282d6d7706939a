/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/code-sandbox/code-sandbox-operator/internal/randid"

	"github.com/code-sandbox/code-sandbox-operator/internal/snapshotstore"
)

// SnapshotStore keeps the tar streams of SandboxSnapshots: the one store
// abstraction of internal/snapshotstore (a node's directory, or with
// --snapshot-registry an OCI registry; *snapshotstore.Node implements it).
// The ref Put returns goes to status.storage, which only the holding node's
// manager may write (config/policy/snapshot_status_policy.yaml), and each
// store checks a ref against its own configuration before reading: nothing
// a user or a sandbox writes decides where data goes or is read from.
type SnapshotStore interface {
	snapshotstore.Store
	// Shared says whether ref is data any node's manager with the same
	// store can open (a registry ref), so that a restore of it may run on
	// any node rather than only on the node that took it.
	Shared(ref string) bool
}

// snapshotKey is the store key (a name for people: a registry repository
// path) of one take of a snapshot: its namespace and UID, both assigned by
// the API server's rules, never free text, and a random part. The random
// part keeps takes apart: a registry names data by digest, and a second
// take of the same files (a reconcile on a stale cache) has the same
// digest, so removing that unrecorded take would remove the recorded one.
func snapshotKey(namespace, uid string) string {
	return "sandboxsnapshots/" + namespace + "/" + uid + "/" + randid.Hex(4)
}

var errStoreStopped = errors.New("the snapshot store stopped reading")

// putSnapshot streams what write writes into the store under key.
func putSnapshot(ctx context.Context, s SnapshotStore, key string, write func(io.Writer) error) (string, int64, error) {
	pr, pw := io.Pipe()
	werr := make(chan error, 1)
	go func() {
		err := write(pw)
		pw.CloseWithError(err)
		werr <- err
	}()
	ref, size, err := s.Put(ctx, key, pr)
	// Unblock the writer if the store stopped reading early.
	pr.CloseWithError(errStoreStopped)
	wErr := <-werr
	switch {
	case err == nil:
		return ref, size, nil
	case wErr != nil && !errors.Is(wErr, errStoreStopped):
		// The writer's error is the cause (too large, the container went).
		return "", 0, wErr
	default:
		return "", 0, err
	}
}

// spoolSnapshot opens ref once and, for data that is not a local file (a
// registry blob), copies it into a 0600 temporary file first: a restore
// reads the tar once per writable path, and each read of a registry ref
// would be a download. The returned open reads the spooled copy; cleanup
// removes it.
func spoolSnapshot(ctx context.Context, s SnapshotStore, ref, dir string) (open func() (io.ReadCloser, error), cleanup func(), err error) {
	if snapshotstore.IsDirRef(ref) {
		return func() (io.ReadCloser, error) { return s.Open(ctx, ref) }, func() {}, nil
	}
	rc, err := s.Open(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	defer rc.Close()
	f, err := os.CreateTemp(dir, ".restore-*.tar") // CreateTemp makes it 0600
	if err != nil {
		return nil, nil, fmt.Errorf("spooling the snapshot: %w", err)
	}
	cleanup = func() { _ = os.Remove(f.Name()) }
	_, err = io.Copy(f, rc)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("reading snapshot %s: %w", ref, err)
	}
	return func() (io.ReadCloser, error) { return os.Open(f.Name()) }, cleanup, nil
}
