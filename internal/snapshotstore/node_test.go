package snapshotstore

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

// A node's store: Put goes to the registry when one is configured, Open and
// Delete go by the ref's kind, and only the node's own registry's refs are
// shared.
func TestNode(t *testing.T) {
	ctx := context.Background()
	d, err := NewDir(filepath.Join(t.TempDir(), "snaps"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	digest := "@sha256:" + strings.Repeat("a", 64)

	// Directory only.
	local := &Node{Dir: d}
	dirRef, _, err := local.Put(ctx, "ns/uid", strings.NewReader("local"))
	if err != nil {
		t.Fatal(err)
	}
	if !IsDirRef(dirRef) || local.Shared(dirRef) {
		t.Errorf("directory-only Put gave %q (shared %v), want a dir ref, not shared", dirRef, local.Shared(dirRef))
	}
	if got, err := readAll(t, local, dirRef); err != nil || string(got) != "local" {
		t.Errorf("Open(%s) = %q, %v", dirRef, got, err)
	}
	for _, ref := range []string{"127.0.0.1:5000/x/y" + digest, "node-local:a", ""} {
		if _, err := local.Open(ctx, ref); !errors.Is(err, ErrInvalidRef) {
			t.Errorf("Open(%q) without a registry: %v, want ErrInvalidRef", ref, err)
		}
		if local.Shared(ref) {
			t.Errorf("Shared(%q) without a registry", ref)
		}
	}
	if testing.Short() {
		return
	}

	addr := testenv.StartRegistry(t)
	r, err := NewRegistry(addr+"/sandbox-snapshots", RegistryOptions{SpoolDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	both := &Node{Dir: d, Registry: r}
	ref, _, err := both.Put(ctx, "ns/uid", bytes.NewReader([]byte("shared")))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ref, addr+"/sandbox-snapshots/ns/uid@sha256:") || !both.Shared(ref) {
		t.Errorf("Put with a registry gave %q (shared %v), want a shared registry ref", ref, both.Shared(ref))
	}
	// The directory's earlier snapshot stays readable, and is not shared.
	if got, err := readAll(t, both, dirRef); err != nil || string(got) != "local" || both.Shared(dirRef) {
		t.Errorf("Open(%s) with a registry = %q, %v (shared %v)", dirRef, got, err, both.Shared(dirRef))
	}
	for _, foreign := range []string{
		"other.example:5000/sandbox-snapshots/ns/uid" + digest,
		addr + "/elsewhere/ns/uid" + digest,
		addr + "/sandbox-snapshots/ns/uid:latest",
	} {
		if both.Shared(foreign) {
			t.Errorf("Shared(%q): another registry's or repository's ref", foreign)
		}
		if _, err := both.Open(ctx, foreign); !errors.Is(err, ErrInvalidRef) {
			t.Errorf("Open(%q): %v, want ErrInvalidRef", foreign, err)
		}
	}
	if err := both.Delete(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if _, err := both.Open(ctx, ref); !errors.Is(err, ErrNotFound) {
		t.Errorf("Open after Delete: %v, want ErrNotFound", err)
	}
}
