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
		return n.Registry.Put(ctx, key, r)
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

// Delete implements Store.
func (n *Node) Delete(ctx context.Context, ref string) error {
	s, err := n.route(ref)
	if err != nil {
		return err
	}
	return s.Delete(ctx, ref)
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
