package sandboxhelper

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"syscall"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// openBase opens the allowed root and the directory or entry below it.
// Every path the helper touches afterwards is resolved by os.Root, which
// refuses any ".." or symlink that would lead out of root: a sandbox can
// plant `ln -s / /app/out`, but /app/out/etc/passwd stays unreachable.
func openBase(f transferFlags) (*os.Root, string, error) {
	rel := ""
	if f.rel != "" {
		clean, err := execio.CleanArchiveName(f.rel)
		if err != nil {
			return nil, "", err
		}
		rel = clean
	}
	if !path.IsAbs(f.root) || path.Clean(f.root) != f.root {
		return nil, "", fmt.Errorf("%w: root %q is not a clean absolute path", execio.ErrInvalidPath, f.root)
	}
	root, err := os.OpenRoot(f.root)
	if err != nil {
		return nil, "", fmt.Errorf("opening %s: %w", f.root, err)
	}
	return root, rel, nil
}

// untar extracts a tar from r below root/dest. Only directories and regular
// files are accepted, with the same name rules as the manager's sanitiser.
// An archive rejected part way leaves the entries before the bad one in
// place: extraction is streamed, never staged.
func untar(f transferFlags, r io.Reader) error {
	lim := execio.UploadLimits{MaxBytes: max(f.maxBytes, 0), MaxEntries: max(f.maxEntries, 0), Symlinks: f.links}
	lim, err := lim.Normalize()
	if err != nil {
		return err
	}
	root, rel, err := openBase(f)
	if err != nil {
		return err
	}
	defer root.Close()
	dest := root
	if rel != "" {
		if err := root.MkdirAll(rel, 0o755); err != nil {
			return fmt.Errorf("creating the destination %s: %w", path.Join(f.root, rel), err)
		}
		if dest, err = root.OpenRoot(rel); err != nil {
			return fmt.Errorf("opening the destination %s: %w", path.Join(f.root, rel), err)
		}
		defer dest.Close()
	}

	type dirMode struct {
		name string
		mode fs.FileMode
	}
	var dirs []dirMode
	var links []*tar.Header
	var total int64
	entries := 0
	tr := tar.NewReader(bufio.NewReaderSize(r, 64<<10))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading the archive: %w", err)
		}
		kind, err := execio.LinkKind(h, lim.Symlinks)
		if err != nil {
			return err
		}
		if kind == "skip" {
			continue
		}
		if entries++; entries > lim.MaxEntries {
			return fmt.Errorf("%w: the archive has more than %d entries", execio.ErrTooLarge, lim.MaxEntries)
		}
		name, err := execio.CleanArchiveName(h.Name)
		if err != nil {
			return err
		}
		if kind == "symlink" {
			if name == "" {
				return fmt.Errorf("%w: archive entry %q is a link without a name", execio.ErrInvalidPath, h.Name)
			}
			links = append(links, &tar.Header{Name: name, Linkname: h.Linkname})
			continue
		}
		mode := fs.FileMode(h.Mode & 0o777)
		if kind == "dir" {
			if name == "" {
				continue
			}
			// Owner rwx while extracting, so a read-only directory can
			// still receive its files; the real mode is set at the end.
			if err := dest.MkdirAll(name, 0o700); err != nil {
				return fmt.Errorf("creating directory %s: %w", name, err)
			}
			dirs = append(dirs, dirMode{name, mode})
			continue
		}
		if name == "" {
			return fmt.Errorf("%w: archive entry %q is a file without a name", execio.ErrInvalidPath, h.Name)
		}
		if h.Size < 0 || h.Size > lim.MaxBytes-total {
			return fmt.Errorf("%w: %q (%d bytes) takes the upload past its %d-byte limit", execio.ErrTooLarge, h.Name, h.Size, lim.MaxBytes)
		}
		total += h.Size
		if parent := path.Dir(name); parent != "." {
			if err := dest.MkdirAll(parent, 0o755); err != nil {
				return fmt.Errorf("creating directory %s: %w", parent, err)
			}
		}
		if err := writeFile(dest, name, mode, tr, h.Size); err != nil {
			return err
		}
	}
	// Links last: while files and directories are written, no link from
	// the archive exists yet, so none can be written through.
	for _, l := range links {
		if err := writeLink(dest, l.Name, l.Linkname); err != nil {
			return err
		}
	}
	// Children before parents, so a parent losing its x bit last cannot
	// block the chmod of what is inside it.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := dest.Chmod(dirs[i].name, dirs[i].mode); err != nil {
			return fmt.Errorf("setting the mode of %s: %w", dirs[i].name, err)
		}
	}
	return nil
}

// writeFile creates name afresh with O_CREATE|O_EXCL, which never follows
// a symlink; whatever held the name before (a file, or a symlink the
// sandbox planted, possibly racing us) is removed first, never written
// through.
func writeFile(dest *os.Root, name string, mode fs.FileMode, content io.Reader, size int64) error {
	var f *os.File
	for attempt := 0; ; attempt++ {
		var err error
		f, err = dest.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrExist) || attempt == 3 {
			return fmt.Errorf("creating %s: %w", name, err)
		}
		if info, err := dest.Lstat(name); err == nil && info.IsDir() {
			return fmt.Errorf("%w: cannot write file %s over an existing directory", execio.ErrInvalidPath, name)
		}
		if err := dest.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("replacing %s: %w", name, err)
		}
	}
	_, err := io.CopyN(f, content, size)
	if err == nil {
		// fchmod on the open file: the umask does not apply and no path
		// is resolved again.
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", name, diskFull(err))
	}
	return nil
}

// writeLink creates name as a symbolic link to target. Every directory on
// the way must be a real directory (os.Root would follow an in-root link;
// an archive's `a -> b` followed by `a/c -> x` must not put c in b), and
// is created if missing. A file or link already at name is replaced, never
// followed; a directory is not replaced.
func writeLink(dest *os.Root, name, target string) error {
	parent := path.Dir(name)
	if parent != "." {
		at := ""
		for _, part := range strings.Split(parent, "/") {
			at = path.Join(at, part)
			info, err := dest.Lstat(at)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				if err := dest.Mkdir(at, 0o755); err != nil {
					return fmt.Errorf("creating directory %s: %w", at, err)
				}
			case err != nil:
				return fmt.Errorf("%s: %w", at, err)
			case !info.IsDir():
				return fmt.Errorf("%w: link %s would be created through %s, which is not a directory", execio.ErrInvalidPath, name, at)
			}
		}
	}
	for attempt := 0; ; attempt++ {
		err := dest.Symlink(target, name)
		if err == nil {
			return nil
		}
		if !errors.Is(err, fs.ErrExist) || attempt == 3 {
			return fmt.Errorf("creating link %s: %w", name, err)
		}
		if info, err := dest.Lstat(name); err == nil && info.IsDir() {
			return fmt.Errorf("%w: cannot create link %s over an existing directory", execio.ErrInvalidPath, name)
		}
		if err := dest.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("replacing %s: %w", name, err)
		}
	}
}

// diskFull reports a full tmpfs or the fsize ulimit as a size problem.
func diskFull(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EFBIG) {
		return fmt.Errorf("%w: %v", execio.ErrTooLarge, err)
	}
	return err
}

// writeTar writes a tar of root/rel to w. Entries are named below rel's base
// name (or the root's, for the root itself). Symlinks are stored as links and
// never followed; sockets, fifos and devices are skipped, and files are
// opened non-blocking, so a fifo swapped in mid-walk cannot hang the walk.
func writeTar(f transferFlags, w io.Writer) error {
	maxBytes := f.maxBytes
	if maxBytes <= 0 {
		maxBytes = execio.DefaultDownloadLimit
	}
	root, rel, err := openBase(f)
	if err != nil {
		return err
	}
	defer root.Close()
	name, at := path.Base(f.root), "."
	if rel != "" {
		name, at = path.Base(rel), rel
	}
	info, err := root.Lstat(at)
	if err != nil {
		return fmt.Errorf("%s: %w", path.Join(f.root, rel), err)
	}
	if !info.Mode().IsRegular() && !info.IsDir() && info.Mode()&fs.ModeSymlink == 0 {
		return fmt.Errorf("%w: %s is a %s, not a file or directory", execio.ErrUnsupportedEntry, path.Join(f.root, rel), info.Mode().Type())
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	t := &tarWalker{root: root, tw: tar.NewWriter(bw), maxBytes: maxBytes}
	if err := t.add(at, name, info); err != nil {
		return err
	}
	if err := t.tw.Close(); err != nil {
		return fmt.Errorf("finishing the archive: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("writing the archive: %w", err)
	}
	return nil
}

type tarWalker struct {
	root     *os.Root
	tw       *tar.Writer
	maxBytes int64
	total    int64
}

func (t *tarWalker) add(rel, name string, info fs.FileInfo) error {
	hdr := &tar.Header{Name: name, Mode: int64(info.Mode().Perm()), ModTime: info.ModTime()}
	switch {
	case info.Mode().IsRegular():
		return t.addFile(rel, hdr)
	case info.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
		if err := t.tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("writing the archive: %w", err)
		}
		d, err := t.root.Open(rel)
		if err != nil {
			return fmt.Errorf("opening directory %s: %w", rel, err)
		}
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil {
			return fmt.Errorf("listing directory %s: %w", rel, err)
		}
		sort.Strings(names)
		for _, child := range names {
			childRel := path.Join(rel, child)
			// Lstat through the root rather than the directory listing's
			// own lstat, which resolves a full path outside os.Root.
			childInfo, err := t.root.Lstat(childRel)
			if errors.Is(err, fs.ErrNotExist) {
				continue // removed while we walked
			}
			if err != nil {
				return fmt.Errorf("%s: %w", childRel, err)
			}
			if err := t.add(childRel, name+"/"+child, childInfo); err != nil {
				return err
			}
		}
		return nil
	case info.Mode()&fs.ModeSymlink != 0:
		target, err := t.root.Readlink(rel)
		if err != nil {
			return fmt.Errorf("reading link %s: %w", rel, err)
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		if err := t.tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("writing the archive: %w", err)
		}
	}
	return nil // sockets, fifos and devices are not files to download
}

func (t *tarWalker) addFile(rel string, hdr *tar.Header) error {
	f, err := t.root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", rel, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if !st.Mode().IsRegular() {
		return nil // swapped for something else since the listing
	}
	if st.Size() > t.maxBytes-t.total {
		return fmt.Errorf("%w: %s (%d bytes) takes the download past its %d-byte limit", execio.ErrTooLarge, rel, st.Size(), t.maxBytes)
	}
	t.total += st.Size()
	hdr.Typeflag, hdr.Size, hdr.Mode, hdr.ModTime = tar.TypeReg, st.Size(), int64(st.Mode().Perm()), st.ModTime()
	if err := t.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("writing the archive: %w", err)
	}
	// A file that grows is cut at its size when opened; one that shrinks
	// cannot be represented in the header already sent.
	if _, err := io.CopyN(t.tw, f, st.Size()); err != nil {
		return fmt.Errorf("reading %s (it may have shrunk while being read): %w", rel, err)
	}
	return nil
}
