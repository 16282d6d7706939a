// Package snapshotstore keeps snapshot tars (dockerruntime.Client.Snapshot's
// output) somewhere a restore can read them again: a local directory
// (Dir), or an OCI registry (Registry, `--snapshot-registry`) so that a
// restore can run on any node.
//
// A reference (ref) is what Put returns and what Open and Delete take. It
// is checked against the store's own configuration before anything is
// opened: a ref written somewhere a tenant can reach (a status, a record)
// never decides which directory or which registry is read. Every read is
// bounded by the store's MaxBytes.
package snapshotstore

import (
	"context"
	"errors"
	"io"
)

// Store keeps snapshot tars.
type Store interface {
	// Put stores the tar read from r under a new reference. key names the
	// snapshot for people (a log line, a repository path); it is checked,
	// never trusted as a path. size is the bytes stored.
	Put(ctx context.Context, key string, r io.Reader) (ref string, size int64, err error)
	// Open returns the tar stored as ref, from its start. The reader stops
	// with ErrTooLarge beyond the store's MaxBytes, and with an error if
	// the content is not what was stored.
	Open(ctx context.Context, ref string) (io.ReadCloser, error)
	// Delete removes ref's data. A ref that is already gone is not an
	// error.
	Delete(ctx context.Context, ref string) error
}

var (
	// ErrInvalidRef: a ref or key this store did not make, or that points
	// outside it.
	ErrInvalidRef = errors.New("invalid snapshot reference")
	// ErrNotFound: no data for ref.
	ErrNotFound = errors.New("snapshot data not found")
	// ErrTooLarge: more than MaxBytes.
	ErrTooLarge = errors.New("snapshot data too large")
)

// DefaultMaxBytes bounds one snapshot when a store is given no MaxBytes:
// 3 GiB, three writable paths at a 1 GiB disk limit each.
const DefaultMaxBytes int64 = 3 << 30

// capReader fails with ErrTooLarge once more than max bytes were read.
type capReader struct {
	r   io.Reader
	max int64
	n   int64
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.n > c.max {
		return 0, ErrTooLarge
	}
	if rest := c.max - c.n + 1; int64(len(p)) > rest {
		p = p[:rest]
	}
	k, err := c.r.Read(p)
	c.n += int64(k)
	if c.n > c.max {
		return k, ErrTooLarge
	}
	return k, err
}

type readCloser struct {
	io.Reader
	io.Closer
}
