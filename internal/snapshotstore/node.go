package snapshotstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Node is a node manager's store of SandboxSnapshots: new snapshots go to
// the registry when one is configured (--snapshot-registry), else to the
// node's directory; Open and Delete go by the ref's kind, so snapshots
// stored in the directory before a registry was configured stay readable
// on their node.
type Node struct {
	// Dir is the node's directory store (required).
	Dir *Dir
	// Registry, when set, receives every Put.
	Registry *Registry
}

// Put implements Store.
func (n *Node) Put(ctx context.Context, key string, r io.Reader) (string, int64, error) {
	if n.Registry != nil {
		var journal func(string) error
		if n.Dir != nil {
			journal = n.Dir.journal
		}
		return n.Registry.PutWith(ctx, key, r, journal)
	}
	if n.Dir == nil {
		return "", 0, errors.New("snapshot store: no directory configured")
	}
	return n.Dir.Put(ctx, key, r)
}

// Open implements Store.
func (n *Node) Open(ctx context.Context, ref string) (io.ReadCloser, error) {
	s, err := n.route(ref)
	if err != nil {
		return nil, err
	}
	return s.Open(ctx, ref)
}

// Delete implements Store. A registry ref this node pushed also leaves
// the node's journal once it is deleted.
func (n *Node) Delete(ctx context.Context, ref string) error {
	s, err := n.route(ref)
	if err != nil {
		return err
	}
	if err := s.Delete(ctx, ref); err != nil {
		return err
	}
	if s == Store(n.Registry) && n.Dir != nil {
		return n.Dir.unjournal(ref)
	}
	return nil
}

// Leftovers lists what this node's directory holds: snapshot files,
// partial files of Puts, and the registry refs this node pushed (its
// journal). A sweep compares them with the refs the SandboxSnapshots
// record and removes the rest (RemoveLeftover).
func (n *Node) Leftovers() ([]Entry, error) {
	if n.Dir == nil {
		return nil, nil
	}
	return n.Dir.entries()
}

// RemoveLeftover removes e: the file, or for a pushed ref the manifest in
// the registry and then the journal entry. A pushed ref of a registry this
// node no longer has configured is refused (ErrInvalidRef) and kept.
func (n *Node) RemoveLeftover(ctx context.Context, e Entry) error {
	switch e.Kind {
	case EntrySnapshot:
		return n.Dir.Delete(ctx, e.Ref)
	case EntryPartial:
		return n.Dir.removeName(e.name)
	case EntryPushed:
		if n.Registry == nil {
			return fmt.Errorf("%w: %q: this node has no --snapshot-registry now", ErrInvalidRef, e.Ref)
		}
		return n.Delete(ctx, e.Ref)
	}
	return fmt.Errorf("snapshot store: unknown entry kind %q", e.Kind)
}

// Shared says whether ref is in this node's registry: data any node with
// the same --snapshot-registry can open, so a restore of it need not run on
// the node that took it. A directory ref, or a ref of another registry, is
// not.
func (n *Node) Shared(ref string) bool {
	if n.Registry == nil || IsDirRef(ref) {
		return false
	}
	_, err := n.Registry.digest(ref)
	return err == nil
}

// IsDirRef says whether ref has the shape of a directory store's ref.
func IsDirRef(ref string) bool { return strings.HasPrefix(ref, "dir:") }

func (n *Node) route(ref string) (Store, error) {
	if IsDirRef(ref) {
		if n.Dir == nil {
			return nil, fmt.Errorf("%w: %q: no directory store on this node", ErrInvalidRef, ref)
		}
		return n.Dir, nil
	}
	if n.Registry == nil {
		return nil, fmt.Errorf("%w: %q is not a directory ref and this node has no --snapshot-registry", ErrInvalidRef, ref)
	}
	return n.Registry, nil
}
