package main

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
)

// writeTree writes a tar of the directory src's contents (not src itself)
// to w. Only regular files and directories are archived, because that is
// all a sandbox accepts; symlinks (never followed) and special files are
// skipped and reported through warn.
func writeTree(w io.Writer, src string, warn func(string)) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == src {
			return nil
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		name := filepath.ToSlash(rel)
		switch {
		case d.IsDir():
			info, err := d.Info()
			if err != nil {
				return err
			}
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: int64(info.Mode().Perm()), ModTime: info.ModTime()})
		case d.Type().IsRegular():
			return writeFileEntry(tw, p, name)
		case d.Type()&fs.ModeSymlink != 0:
			warn(fmt.Sprintf("skipping symlink %s: only regular files and directories are copied", p))
		default:
			warn(fmt.Sprintf("skipping %s: %s is not a regular file or a directory", p, d.Type()))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("archiving %s: %w", src, err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("archiving %s: %w", src, err)
	}
	return nil
}

func writeFileEntry(tw *tar.Writer, p, name string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	// The header comes from the open file, not the walk, so that a file
	// swapped for something else in between is noticed.
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s changed while it was being archived", p)
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: int64(info.Mode().Perm()), Size: info.Size(), ModTime: info.ModTime()}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.Copy(tw, io.LimitReader(f, hdr.Size))
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if n != hdr.Size {
		return fmt.Errorf("%s shrank from %d to %d bytes while it was being archived", p, hdr.Size, n)
	}
	return nil
}

// extractStats count what extractTree wrote.
type extractStats struct {
	Files, Dirs int
	Bytes       int64
}

// extractTree writes a download archive to dst. The node API names every
// entry below the source's base name: "base" for a file, "base/…" for a
// tree. Like kubectl cp, a tree's contents land in dst (created if
// missing), and a file becomes dst itself, or dst/base when dst is an
// existing directory or ends with a separator.
//
// The archive comes from a sandbox, so from code nobody vetted: every write
// goes through an os.Root opened on the destination, which refuses paths
// that leave it (.., absolute names, symlinks pointing out); an existing
// symlink is never written through; entries other than regular files and
// directories are skipped with a warning; modes lose setuid, setgid and
// sticky bits.
func extractTree(r io.Reader, dst string, warn func(string)) (extractStats, error) {
	var st extractStats
	tr := tar.NewReader(r)
	hdr, err := tr.Next()
	if errors.Is(err, io.EOF) {
		return st, errors.New("the sandbox sent an empty archive")
	}
	if err != nil {
		return st, fmt.Errorf("reading the archive: %w", err)
	}
	top, rest, err := splitEntryName(hdr.Name)
	if err != nil {
		return st, err
	}
	switch {
	case rest != "":
	case hdr.Typeflag == tar.TypeReg:
		return extractSingleFile(tr, hdr, top, dst)
	case hdr.Typeflag != tar.TypeDir:
		return st, fmt.Errorf("%s is not a regular file or a directory in the sandbox (tar type %q); nothing was copied", top, hdr.Typeflag)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return st, fmt.Errorf("creating %s: %w", dst, err)
	}
	root, err := os.OpenRoot(dst)
	if err != nil {
		return st, fmt.Errorf("opening %s: %w", dst, err)
	}
	defer root.Close()
	for {
		t, rel, err := splitEntryName(hdr.Name)
		if err != nil {
			return st, err
		}
		if t != top {
			return st, fmt.Errorf("refusing archive entry %q: not below %q like the entries before it", hdr.Name, top)
		}
		if err := extractEntry(root, tr, hdr, rel, &st, warn); err != nil {
			return st, fmt.Errorf("extracting %q into %s: %w", hdr.Name, dst, err)
		}
		hdr, err = tr.Next()
		if errors.Is(err, io.EOF) {
			return st, nil
		}
		if err != nil {
			return st, fmt.Errorf("reading the archive: %w", err)
		}
	}
}

// splitEntryName splits an entry name into its first component and the
// rest, refusing anything that is not a clean relative path.
func splitEntryName(name string) (top, rest string, err error) {
	n := strings.TrimPrefix(name, "./")
	n = strings.TrimSuffix(n, "/")
	if n == "" || strings.Contains(n, "\\") || !filepath.IsLocal(n) || path.Clean(n) != n {
		return "", "", fmt.Errorf("refusing archive entry %q: not a clean relative path", name)
	}
	top, rest, _ = strings.Cut(n, "/")
	return top, rest, nil
}

func extractEntry(root *os.Root, tr *tar.Reader, hdr *tar.Header, rel string, st *extractStats, warn func(string)) error {
	name := rel
	if name == "" {
		name = "."
	}
	perm := os.FileMode(hdr.Mode).Perm()
	switch hdr.Typeflag {
	case tar.TypeDir:
		// The owner keeps rwx so that the entries inside can be written.
		if err := root.MkdirAll(name, perm|0o700); err != nil {
			return err
		}
		if name != "." {
			if err := root.Chmod(name, perm|0o700); err != nil {
				return err
			}
		}
		st.Dirs++
		return nil
	case tar.TypeReg:
		if rel == "" {
			return errors.New("a file where the archive's top directory should be")
		}
		if dir := path.Dir(rel); dir != "." {
			if err := root.MkdirAll(dir, 0o755); err != nil {
				return err
			}
		}
		n, err := writeRootFile(root, rel, perm, tr)
		st.Bytes += n
		if err != nil {
			return err
		}
		st.Files++
		if !hdr.ModTime.IsZero() {
			_ = root.Chtimes(rel, hdr.ModTime, hdr.ModTime)
		}
		return nil
	default:
		warn(fmt.Sprintf("skipping %s: only regular files and directories are copied (tar type %q)", hdr.Name, hdr.Typeflag))
		return nil
	}
}

// writeRootFile writes one file beneath root, never through a symlink.
func writeRootFile(root *os.Root, name string, perm os.FileMode, r io.Reader) (int64, error) {
	if fi, err := root.Lstat(name); err == nil {
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			return 0, fmt.Errorf("refusing to write through the existing symlink %s", name)
		case !fi.Mode().IsRegular():
			return 0, fmt.Errorf("%s exists and is not a regular file", name)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, r)
	cerr := f.Close()
	if err != nil {
		return n, err
	}
	if cerr != nil {
		return n, cerr
	}
	// O_CREATE's mode is filtered by the umask and ignored for an existing
	// file; the archive's permission bits (without setuid and friends) win.
	return n, root.Chmod(name, perm)
}

func extractSingleFile(tr *tar.Reader, hdr *tar.Header, base, dst string) (extractStats, error) {
	var st extractStats
	dir, name := filepath.Dir(dst), filepath.Base(dst)
	if strings.HasSuffix(dst, string(filepath.Separator)) || strings.HasSuffix(dst, "/") {
		dir, name = dst, base
	} else if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		dir, name = dst, base
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return st, fmt.Errorf("creating %s: %w", dir, err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return st, fmt.Errorf("opening %s: %w", dir, err)
	}
	defer root.Close()
	n, err := writeRootFile(root, name, os.FileMode(hdr.Mode).Perm(), tr)
	st.Bytes = n
	if err != nil {
		return st, fmt.Errorf("writing %s: %w", filepath.Join(dir, name), err)
	}
	st.Files = 1
	if !hdr.ModTime.IsZero() {
		_ = root.Chtimes(name, hdr.ModTime, hdr.ModTime)
	}
	if next, err := tr.Next(); !errors.Is(err, io.EOF) {
		if err != nil {
			return st, fmt.Errorf("reading the archive: %w", err)
		}
		return st, fmt.Errorf("refusing archive entry %q after the single file %q", next.Name, hdr.Name)
	}
	return st, nil
}
