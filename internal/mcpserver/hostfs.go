package mcpserver

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// HostRoots are the host directories the file-transfer tools may read from
// and write to. The transfers themselves (archiving host trees, writing
// downloads) are internal/hostfs, shared with kubectl sandbox cp. A host path is accepted only when its real location (all
// symlinks resolved) lies inside a root, and every file is then opened
// through an os.Root, so that neither a symlink planted in the tree nor one
// swapped in while a copy runs can lead outside it.
type HostRoots struct {
	roots []string
	// perIdentity gives every caller but the local one its own
	// subdirectory of each root (see ForCaller).
	perIdentity bool
}

// SeparateIdentities makes each caller other than LocalIdentity see, in
// place of each root, its own subdirectory <root>/<IdentityHash>: with
// several identities on one server (HTTP), one identity must not read what
// another copied out of its sandbox, nor plant files another copies in.
func (h *HostRoots) SeparateIdentities() { h.perIdentity = true }

// ForCaller returns the roots caller may use: h itself, or with
// SeparateIdentities the caller's own subdirectories, created (0700) on
// first use.
func (h *HostRoots) ForCaller(caller contract.Caller) (*HostRoots, error) {
	if !h.perIdentity || len(h.roots) == 0 || caller.ID == contract.LocalIdentity {
		return h, nil
	}
	sub := &HostRoots{}
	for _, r := range h.roots {
		d := filepath.Join(r, contract.IdentityHash(caller.ID))
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("creating this identity's host directory: %w", err)
		}
		// Nothing but this server writes in the root itself, but a
		// symlink put there by hand must not redirect an identity.
		if st, err := os.Lstat(d); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("this identity's host directory %s is not a directory", d)
		}
		sub.roots = append(sub.roots, d)
	}
	return sub, nil
}

// NewHostRoots resolves each directory to its real absolute path.
func NewHostRoots(dirs []string) (*HostRoots, error) {
	h := &HostRoots{}
	for _, d := range dirs {
		abs, err := filepath.Abs(d)
		if err != nil {
			return nil, fmt.Errorf("host directory %q: %w", d, err)
		}
		real, err := filepath.EvalSymlinks(abs)
		if err != nil {
			return nil, fmt.Errorf("host directory %q: %w", d, err)
		}
		st, err := os.Stat(real)
		if err != nil {
			return nil, fmt.Errorf("host directory %q: %w", d, err)
		}
		if !st.IsDir() {
			return nil, fmt.Errorf("host directory %q is not a directory", d)
		}
		if real == filepath.VolumeName(real)+string(filepath.Separator) {
			return nil, fmt.Errorf("host directory %q is the filesystem root; name a narrower directory", d)
		}
		h.roots = append(h.roots, real)
	}
	return h, nil
}

// Roots lists the allowed directories.
func (h *HostRoots) Roots() []string { return append([]string(nil), h.roots...) }

func (h *HostRoots) disabledError(arg string) error {
	return argError("%s: this server may not touch host files: it was started without --allow-host-dir. Restart it with --allow-host-dir DIR to allow a directory, or use write_file/read_file to move contents through the conversation", arg)
}

// within returns the root that contains real and real's path relative to
// it, or "" when none does.
func (h *HostRoots) within(real string) (root, rel string) {
	for _, r := range h.roots {
		if real == r {
			return r, "."
		}
		if strings.HasPrefix(real, r+string(filepath.Separator)) {
			return r, strings.TrimPrefix(real, r+string(filepath.Separator))
		}
	}
	return "", ""
}

func (h *HostRoots) checkSyntax(arg, p string) (string, error) {
	if len(h.roots) == 0 {
		return "", h.disabledError(arg)
	}
	if p == "" {
		return "", argError("%q is required: an absolute host path under %s", arg, strings.Join(h.roots, ", "))
	}
	if strings.IndexByte(p, 0) >= 0 || len(p) > 4096 {
		return "", argError("%q is not a usable host path", arg)
	}
	if !filepath.IsAbs(p) {
		return "", argError("%q %q must be an absolute host path under %s", arg, Truncate(p, 200), strings.Join(h.roots, ", "))
	}
	return filepath.Clean(p), nil
}

// openExisting resolves an existing host path inside a root and returns the
// opened root with the path relative to it (in fs.FS form).
func (h *HostRoots) openExisting(arg, p string) (*os.Root, string, error) {
	clean, err := h.checkSyntax(arg, p)
	if err != nil {
		return nil, "", err
	}
	real, err := filepath.EvalSymlinks(clean)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", argError("%q %q does not exist on the host", arg, Truncate(p, 200))
	}
	if err != nil {
		return nil, "", argError("%q %q cannot be resolved: %v", arg, Truncate(p, 200), err)
	}
	rootDir, rel := h.within(real)
	if rootDir == "" {
		return nil, "", argError("%q %q resolves to %s, which is outside the allowed host directories (%s)", arg, Truncate(p, 200), real, strings.Join(h.roots, ", "))
	}
	root, err := os.OpenRoot(rootDir)
	if err != nil {
		return nil, "", fmt.Errorf("opening allowed host directory %s: %w", rootDir, err)
	}
	return root, filepath.ToSlash(rel), nil
}

// openDest resolves a host path that may not exist yet: its longest
// existing ancestor must resolve inside a root.
func (h *HostRoots) openDest(arg, p string) (*os.Root, string, error) {
	clean, err := h.checkSyntax(arg, p)
	if err != nil {
		return nil, "", err
	}
	existing, rest := clean, ""
	for {
		if _, err := os.Lstat(existing); err == nil {
			break
		}
		parent := filepath.Dir(existing)
		if parent == existing {
			break
		}
		rest = filepath.Join(filepath.Base(existing), rest)
		existing = parent
	}
	real, err := filepath.EvalSymlinks(existing)
	if err != nil {
		return nil, "", argError("%q %q cannot be resolved: %v", arg, Truncate(p, 200), err)
	}
	real = filepath.Join(real, rest)
	rootDir, rel := h.within(real)
	if rootDir == "" {
		return nil, "", argError("%q %q resolves to %s, which is outside the allowed host directories (%s)", arg, Truncate(p, 200), real, strings.Join(h.roots, ", "))
	}
	if rel == "." {
		return nil, "", argError("%q %q is an allowed root itself; name a file or directory inside it", arg, Truncate(p, 200))
	}
	root, err := os.OpenRoot(rootDir)
	if err != nil {
		return nil, "", fmt.Errorf("opening allowed host directory %s: %w", rootDir, err)
	}
	return root, filepath.ToSlash(rel), nil
}
