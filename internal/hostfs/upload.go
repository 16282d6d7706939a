package hostfs

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"runtime"
	"strings"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// TreeLimits cap a host tree sent to a sandbox; zero means no cap.
type TreeLimits struct {
	MaxBytes   int64
	MaxEntries int
}

// TreeStats describe a host tree sent to a sandbox.
type TreeStats struct {
	Files, Dirs int
	Bytes       int64
	// Skipped are the entries that are neither regular files nor
	// directories (symlinks, sockets, devices), relative to the tree's top
	// and slash-separated: they are never followed or sent.
	Skipped []string
}

// walkTree calls fn for every entry below dir (dir itself excluded) in
// lexical order, never following a symlink, with the entry's name relative
// to dir. dir must be a directory.
func walkTree(root *os.Root, dir string, fn func(p, name string, d fs.DirEntry) error) error {
	dir = path.Clean(dir)
	return fs.WalkDir(root.FS(), dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			if !d.IsDir() {
				return fmt.Errorf("%w: %s is not a directory", ErrWrongType, p)
			}
			return nil
		}
		name := p
		if dir != "." {
			name = strings.TrimPrefix(p, dir+"/")
		}
		return fn(p, name, d)
	})
}

// ScanTree counts the tree below dir in root without following symlinks,
// and fails with execio.ErrTooLarge once lim is exceeded, so that an
// oversized upload is refused before anything is sent.
func ScanTree(root *os.Root, dir string, lim TreeLimits) (TreeStats, error) {
	var st TreeStats
	err := walkTree(root, dir, func(_, name string, d fs.DirEntry) error {
		switch {
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
			st.Skipped = append(st.Skipped, name)
			return nil
		}
		return st.check(lim)
	})
	return st, err
}

func (st *TreeStats) check(lim TreeLimits) error {
	if lim.MaxEntries > 0 && st.Files+st.Dirs > lim.MaxEntries {
		return fmt.Errorf("%w: the directory has more than %d entries", execio.ErrTooLarge, lim.MaxEntries)
	}
	if lim.MaxBytes > 0 && st.Bytes > lim.MaxBytes {
		return fmt.Errorf("%w: the directory holds more than %d bytes of files", execio.ErrTooLarge, lim.MaxBytes)
	}
	return nil
}

// WriteTree writes a tar of the tree below dir in root (not dir itself) to
// w, with entry names relative to dir: directories and regular files only,
// permission bits only. Symlinks are never followed; they and special
// files are left out and listed in the stats' Skipped. Each file's header
// comes from the open file, so a file swapped for something else since the
// walk is noticed, and one that changed size is sent as it is now but never
// beyond lim.
func WriteTree(w io.Writer, root *os.Root, dir string, lim TreeLimits) (TreeStats, error) {
	var st TreeStats
	tw := tar.NewWriter(w)
	fsys := root.FS()
	err := walkTree(root, dir, func(p, name string, d fs.DirEntry) error {
		switch {
		case d.IsDir():
			info, err := d.Info()
			if err != nil {
				return err
			}
			st.Dirs++
			if err := st.check(lim); err != nil {
				return err
			}
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: sentMode(info.Mode()), ModTime: info.ModTime()})
		case d.Type().IsRegular():
			return writeTreeFile(tw, fsys, p, name, &st, lim)
		default:
			st.Skipped = append(st.Skipped, name)
			return nil
		}
	})
	if err != nil {
		return st, fmt.Errorf("archiving %s: %w", dir, err)
	}
	if err := tw.Close(); err != nil {
		return st, fmt.Errorf("archiving %s: %w", dir, err)
	}
	return st, nil
}

// sentMode is the mode an uploaded entry carries: its permission bits. On
// Windows these only say read-only or not (Go reports 0o666 or 0o444 for a
// file, 0o777 or 0o555 for a directory), so group and world write are
// dropped there rather than handing the sandbox world-writable files; no
// file has an exec bit there.
func sentMode(m fs.FileMode) int64 {
	p := m.Perm()
	if runtime.GOOS == "windows" {
		p &^= 0o022
	}
	return int64(p)
}

func writeTreeFile(tw *tar.Writer, fsys fs.FS, p, name string, st *TreeStats, lim TreeLimits) error {
	f, err := fsys.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s changed into %s while it was being archived", p, describeMode(info.Mode()))
	}
	st.Files++
	st.Bytes += info.Size()
	if err := st.check(lim); err != nil {
		return err
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: sentMode(info.Mode()), Size: info.Size(), ModTime: info.ModTime()}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
		return fmt.Errorf("reading %s: %w (did it shrink while being copied?)", p, err)
	}
	return nil
}
