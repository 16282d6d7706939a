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
	"path/filepath"
	"regexp"
)

// SnapshotStore keeps the tar streams of SandboxSnapshots, each under a key
// the manager derives from the snapshot's UID alone: nothing a user or a
// sandbox writes decides where data goes. LocalSnapshotStore keeps them
// under the manager's state directory; a registry store (--snapshot-registry)
// can implement the same three calls.
type SnapshotStore interface {
	// Put stores what write writes under key, replacing whatever was there,
	// and returns its size. Nothing is kept when write fails.
	Put(ctx context.Context, key string, write func(io.Writer) error) (int64, error)
	// Open returns the stored stream of key from its start, or an error
	// wrapping os.ErrNotExist.
	Open(ctx context.Context, key string) (io.ReadCloser, error)
	// Delete removes key's data; deleting what does not exist succeeds.
	Delete(ctx context.Context, key string) error
	// Location describes where key's data is, for status.storage: for
	// operators only, never read back.
	Location(key string) string
}

// snapshotKey is the shape of a key: a Kubernetes UID (lower-case hex and
// dashes). Anything else is refused before a path is built.
var snapshotKey = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

// LocalSnapshotStore keeps each snapshot as one file, DIR/KEY.tar, mode
// 0600 in a 0700 directory: the files are tenant data.
type LocalSnapshotStore struct {
	dir  string
	node string
}

// NewLocalSnapshotStore makes (or tightens) dir and returns a store in it.
func NewLocalSnapshotStore(dir, node string) (*LocalSnapshotStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the snapshot directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("securing the snapshot directory: %w", err)
	}
	return &LocalSnapshotStore{dir: dir, node: node}, nil
}

func (s *LocalSnapshotStore) path(key string) (string, error) {
	if !snapshotKey.MatchString(key) {
		return "", fmt.Errorf("invalid snapshot key %q: want a UID (lower-case letters, digits and dashes)", key)
	}
	return filepath.Join(s.dir, key+".tar"), nil
}

// Put writes to KEY.tar.partial and renames it into place once complete,
// so that a crash never leaves a truncated snapshot under the real name.
func (s *LocalSnapshotStore) Put(_ context.Context, key string, write func(io.Writer) error) (int64, error) {
	p, err := s.path(key)
	if err != nil {
		return 0, err
	}
	tmp := p + ".partial"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, err
	}
	werr := write(f)
	if werr == nil {
		werr = f.Sync()
	}
	var size int64
	if st, err := f.Stat(); err == nil {
		size = st.Size()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, p)
	}
	if werr != nil {
		_ = os.Remove(tmp)
		return 0, werr
	}
	return size, nil
}

// Open opens KEY.tar.
func (s *LocalSnapshotStore) Open(_ context.Context, key string) (io.ReadCloser, error) {
	p, err := s.path(key)
	if err != nil {
		return nil, err
	}
	return os.Open(p)
}

// Delete removes KEY.tar and any partial write of it.
func (s *LocalSnapshotStore) Delete(_ context.Context, key string) error {
	p, err := s.path(key)
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range []string{p, p + ".partial"} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Location is "node-local:NODE".
func (s *LocalSnapshotStore) Location(string) string { return "node-local:" + s.node }
