package mcpserver

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// HostRoots are the host directories the file-transfer tools may read from
// and write to. A host path is accepted only when its real location (all
// symlinks resolved) lies inside a root, and every file is then opened
// through an os.Root, so that neither a symlink planted in the tree nor one
// swapped in while a copy runs can lead outside it.
type HostRoots struct {
	roots []string
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
		return "", argError("%q %q must be an absolute host path under %s", arg, truncate(p, 200), strings.Join(h.roots, ", "))
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
		return nil, "", argError("%q %q does not exist on the host", arg, truncate(p, 200))
	}
	if err != nil {
		return nil, "", argError("%q %q cannot be resolved: %v", arg, truncate(p, 200), err)
	}
	rootDir, rel := h.within(real)
	if rootDir == "" {
		return nil, "", argError("%q %q resolves to %s, which is outside the allowed host directories (%s)", arg, truncate(p, 200), real, strings.Join(h.roots, ", "))
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
		return nil, "", argError("%q %q cannot be resolved: %v", arg, truncate(p, 200), err)
	}
	real = filepath.Join(real, rest)
	rootDir, rel := h.within(real)
	if rootDir == "" {
		return nil, "", argError("%q %q resolves to %s, which is outside the allowed host directories (%s)", arg, truncate(p, 200), real, strings.Join(h.roots, ", "))
	}
	if rel == "." {
		return nil, "", argError("%q %q is an allowed root itself; name a file or directory inside it", arg, truncate(p, 200))
	}
	root, err := os.OpenRoot(rootDir)
	if err != nil {
		return nil, "", fmt.Errorf("opening allowed host directory %s: %w", rootDir, err)
	}
	return root, filepath.ToSlash(rel), nil
}

// hostTreeStats describe a host tree sent to a sandbox.
type hostTreeStats struct {
	Files, Dirs int
	Bytes       int64
	// Skipped are entries that are neither regular files nor directories
	// (symlinks, sockets, devices): they are never followed or sent.
	Skipped []string
}

// scanHostTree walks dir (relative to root) without following symlinks and
// fails once the caps are exceeded, before anything is sent.
func scanHostTree(root *os.Root, dir string, maxBytes int64, maxEntries int) (hostTreeStats, error) {
	var st hostTreeStats
	err := fs.WalkDir(root.FS(), dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case p == dir:
			if !d.IsDir() {
				return argError("%q is not a directory; use copy_file for a single file", p)
			}
			return nil
		case d.IsDir():
			st.Dirs++
		case d.Type().IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			st.Files++
			st.Bytes += info.Size()
		default:
			st.Skipped = append(st.Skipped, p)
			return nil
		}
		if st.Files+st.Dirs > maxEntries {
			return argError("the directory has more than %d entries; copy a smaller directory (the limit is --max-upload-entries)", maxEntries)
		}
		if st.Bytes > maxBytes {
			return argError("the directory holds more than %d bytes of files; copy a smaller directory (the limit is --max-upload-bytes)", maxBytes)
		}
		return nil
	})
	return st, err
}

// writeHostTree writes the tree below dir as a tar whose entries are
// relative to dir. Files that changed since scanHostTree are sent as they
// are now, but never beyond the caps.
func writeHostTree(root *os.Root, dir string, w io.Writer, maxBytes int64) error {
	tw := tar.NewWriter(w)
	var sent int64
	fsys := root.FS()
	err := fs.WalkDir(fsys, dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		name := strings.TrimPrefix(p, dir+"/")
		if dir == "." {
			name = p
		}
		switch {
		case d.IsDir():
			info, err := d.Info()
			if err != nil {
				return err
			}
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: int64(info.Mode().Perm()), ModTime: info.ModTime()})
		case d.Type().IsRegular():
			n, err := writeHostFile(tw, fsys, p, name, maxBytes-sent)
			sent += n
			return err
		default:
			return nil
		}
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// writeHostFile adds one regular file to tw, checking on the open file
// that it is still regular and within budget.
func writeHostFile(tw *tar.Writer, fsys fs.FS, p, name string, budget int64) (int64, error) {
	f, err := fsys.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if !info.Mode().IsRegular() {
		return 0, argError("%q is not a regular file", p)
	}
	if info.Size() > budget {
		return 0, argError("%q (%d bytes) exceeds the size limit", p, info.Size())
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: int64(info.Mode().Perm()), Size: info.Size(), ModTime: info.ModTime()}
	if err := tw.WriteHeader(hdr); err != nil {
		return 0, err
	}
	n, err := io.CopyN(tw, f, info.Size())
	if err != nil {
		return n, fmt.Errorf("reading %s: %w (did it shrink while being copied?)", p, err)
	}
	return n, nil
}

// singleFileTar writes a tar holding one file called name.
func singleFileTar(w io.Writer, name string, mode int64, content io.Reader, size int64) error {
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: size}); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, content, size); err != nil {
		return err
	}
	return tw.Close()
}

// extractStats describe a download written to the host.
type extractStats struct {
	Files, Dirs int
	Bytes       int64
	// Path is where the download landed, relative to the root.
	Path    string
	Skipped []string
}

// extractToHost writes a tar produced by Backend.Download (entries named
// below the source's base name) to dest inside root. A single file lands at
// dest, or inside dest when dest is an existing directory; a tree becomes
// directory dest. Only regular files and directories are written, every
// open goes through root, and files appear only once complete.
func extractToHost(root *os.Root, dest string, r io.Reader, maxBytes int64) (extractStats, error) {
	var st extractStats
	tr := tar.NewReader(r)
	srcBase := ""
	target := dest
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return st, fmt.Errorf("reading the sandbox's archive: %w", err)
		}
		name, err := execio.CleanArchiveName(hdr.Name)
		if err != nil || name == "" {
			return st, fmt.Errorf("the sandbox sent an unusable entry %q: %w", hdr.Name, execio.ErrInvalidPath)
		}
		first, rest, _ := strings.Cut(name, "/")
		if srcBase == "" {
			srcBase = first
			if info, err := root.Stat(dest); err == nil && info.IsDir() && hdr.Typeflag != tar.TypeDir {
				target = path.Join(dest, srcBase)
			} else if err == nil && !info.IsDir() && hdr.Typeflag == tar.TypeDir {
				return st, argError("local_dest_path %q is an existing file, but the sandbox path is a directory", dest)
			}
			st.Path = target
		} else if first != srcBase {
			return st, fmt.Errorf("the sandbox's archive has entries for more than one source (%q, %q)", srcBase, first)
		}
		out := target
		if rest != "" {
			out = path.Join(target, rest)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(out, 0o755); err != nil {
				return st, fmt.Errorf("creating %s: %w", out, err)
			}
			st.Dirs++
		case tar.TypeReg:
			if st.Bytes+hdr.Size > maxBytes {
				return st, fmt.Errorf("%w: more than %d bytes", execio.ErrTooLarge, maxBytes)
			}
			if err := root.MkdirAll(path.Dir(out), 0o755); err != nil {
				return st, fmt.Errorf("creating %s: %w", path.Dir(out), err)
			}
			mode := os.FileMode(0o644)
			if hdr.Mode&0o111 != 0 {
				mode = 0o755
			}
			if err := writeRootFile(root, out, tr, hdr.Size, mode); err != nil {
				return st, err
			}
			st.Files++
			st.Bytes += hdr.Size
		default:
			st.Skipped = append(st.Skipped, name)
		}
	}
	if srcBase == "" {
		return st, errors.New("the sandbox sent an empty archive")
	}
	return st, nil
}

// writeRootFile writes size bytes from r to name inside root, through a
// temporary file renamed into place, so a failed copy leaves no half file.
func writeRootFile(root *os.Root, name string, r io.Reader, size int64, mode os.FileMode) error {
	if info, err := root.Lstat(name); err == nil && !info.Mode().IsRegular() {
		return argError("%q exists on the host and is not a regular file; refusing to replace it", name)
	}
	tmp := path.Join(path.Dir(name), "."+path.Base(name)+".partial-"+randomHex(6))
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("creating %s: %w", name, err)
	}
	_, err = io.CopyN(f, r, size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, name)
	}
	if err != nil {
		_ = root.Remove(tmp)
		return fmt.Errorf("writing %s: %w", name, err)
	}
	return nil
}
