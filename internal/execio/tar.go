package execio

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Normalize fills zero limits with the defaults and refuses negative ones.
func (l UploadLimits) Normalize() (UploadLimits, error) {
	if l.MaxBytes < 0 || l.MaxEntries < 0 {
		return UploadLimits{}, fmt.Errorf("%w: upload limits must not be negative (maxBytes %d, maxEntries %d)", ErrInvalidRequest, l.MaxBytes, l.MaxEntries)
	}
	if l.MaxBytes == 0 {
		l.MaxBytes = DefaultUploadLimit
	}
	if l.MaxEntries == 0 {
		l.MaxEntries = DefaultMaxEntries
	}
	return l, nil
}

// EntryKind classifies a tar header for an upload: "dir", "file", "skip"
// (metadata-only PAX global headers) or an error wrapping
// ErrUnsupportedEntry that names the entry and its type. Every tar walker
// that reads an archive someone else wrote uses it before reading any
// content.
//
// A sparse file is refused whatever its type flag says: archive/tar
// yields a sparse file's holes as zeros without consuming input, so a
// crafted header (GNU type 'S', or a PAX regular file carrying GNU.sparse.*
// records) declaring a hole of many terabytes makes its reader spin on a
// core for hours while reading nothing. Nothing we write makes sparse
// entries (the in-sandbox helper, SanitizeTar and hostfs write regular
// files), so only a forged archive carries one.
func EntryKind(h *tar.Header) (string, error) {
	if isSparse(h) {
		return "", fmt.Errorf("%w: %q is a sparse file; only regular files and directories are transferred", ErrUnsupportedEntry, h.Name)
	}
	switch h.Typeflag {
	case tar.TypeDir:
		return "dir", nil
	case tar.TypeReg: // tar.Reader reports the legacy TypeRegA as TypeReg
		return "file", nil
	case tar.TypeXGlobalHeader:
		return "skip", nil
	}
	return "", fmt.Errorf("%w: %q is a %s; only regular files and directories may be uploaded", ErrUnsupportedEntry, h.Name, typeName(h.Typeflag))
}

// MaxLinkTarget bounds a symbolic link's target (Linux's PATH_MAX less the
// terminating NUL).
const MaxLinkTarget = 4095

// LinkKind classifies h for a walker that accepts symbolic links
// (UploadLimits.Symlinks): "symlink" for a link with a usable target, else
// what EntryKind says. The target is not checked against any root: it is
// the link's content, and nothing is ever written through it.
func LinkKind(h *tar.Header, symlinks bool) (string, error) {
	if !symlinks || h.Typeflag != tar.TypeSymlink {
		return EntryKind(h)
	}
	if h.Linkname == "" || len(h.Linkname) > MaxLinkTarget || strings.ContainsRune(h.Linkname, 0) {
		return "", fmt.Errorf("%w: symbolic link %q has an empty, over-long or NUL-bearing target", ErrUnsupportedEntry, h.Name)
	}
	return "symlink", nil
}

// isSparse reports a GNU sparse entry: the old GNU format's type 'S', or
// any of the PAX formats (0.0, 0.1, 1.0), which archive/tar reports as a
// regular file and recognises by their GNU.sparse.* records.
func isSparse(h *tar.Header) bool {
	if h.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

func typeName(t byte) string {
	switch t {
	case tar.TypeSymlink:
		return "symbolic link"
	case tar.TypeLink:
		return "hard link"
	case tar.TypeChar:
		return "character device"
	case tar.TypeBlock:
		return "block device"
	case tar.TypeFifo:
		return "fifo"
	case tar.TypeGNUSparse:
		return "sparse file"
	}
	return fmt.Sprintf("tar entry of type %q", t)
}

// SanitizeTar copies an upload archive from r to w, keeping only what a
// sandbox may receive: directories and regular files (and symbolic links
// with lim.Symlinks) with clean relative names and permission bits only. Ownership, extended attributes and PAX
// records are dropped. It stops with ErrTooLarge as soon as a header
// declares more content or entries than lim allows, before reading that
// content, so a tar bomb costs nothing. A malformed archive is
// ErrInvalidRequest.
func SanitizeTar(r io.Reader, w io.Writer, lim UploadLimits) (TransferStats, error) {
	var stats TransferStats
	lim, err := lim.Normalize()
	if err != nil {
		return stats, err
	}
	tr := tar.NewReader(r)
	tw := tar.NewWriter(w)
	entries := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return stats, fmt.Errorf("%w: reading the upload archive: %v", ErrInvalidRequest, err)
		}
		kind, err := LinkKind(h, lim.Symlinks)
		if err != nil {
			return stats, err
		}
		if kind == "skip" {
			continue
		}
		if entries++; entries > lim.MaxEntries {
			return stats, fmt.Errorf("%w: the upload has more than %d entries", ErrTooLarge, lim.MaxEntries)
		}
		name, err := CleanArchiveName(h.Name)
		if err != nil {
			return stats, err
		}
		clean := &tar.Header{Name: name, Mode: h.Mode & 0o777, ModTime: h.ModTime}
		if kind == "dir" {
			if name == "" {
				continue // the archive's own root ("./") already exists
			}
			clean.Typeflag, clean.Name = tar.TypeDir, name+"/"
			if err := tw.WriteHeader(clean); err != nil {
				return stats, fmt.Errorf("writing the sanitised archive: %w", err)
			}
			stats.Dirs++
			continue
		}
		if name == "" {
			return stats, fmt.Errorf("%w: archive entry %q is a file without a name", ErrInvalidPath, h.Name)
		}
		if kind == "symlink" {
			clean.Typeflag, clean.Linkname, clean.Mode = tar.TypeSymlink, h.Linkname, 0o777
			if err := tw.WriteHeader(clean); err != nil {
				return stats, fmt.Errorf("writing the sanitised archive: %w", err)
			}
			stats.Links++
			continue
		}
		if h.Size < 0 || h.Size > lim.MaxBytes-stats.Bytes {
			return stats, fmt.Errorf("%w: %q (%d bytes) takes the upload past its %d-byte limit", ErrTooLarge, h.Name, h.Size, lim.MaxBytes)
		}
		clean.Typeflag, clean.Size = tar.TypeReg, h.Size
		if err := tw.WriteHeader(clean); err != nil {
			return stats, fmt.Errorf("writing the sanitised archive: %w", err)
		}
		if _, err := io.CopyN(tw, tr, h.Size); err != nil {
			return stats, fmt.Errorf("copying %q into the sanitised archive: %w", h.Name, err)
		}
		stats.Files++
		stats.Bytes += h.Size
	}
	if err := tw.Close(); err != nil {
		return stats, fmt.Errorf("finishing the sanitised archive: %w", err)
	}
	return stats, nil
}

// WriteSingleFileTar writes a tar holding one regular file, for uploads of
// a single file's content. name must pass CleanArchiveName; content must
// yield exactly size bytes.
func WriteSingleFileTar(w io.Writer, name string, mode int64, size int64, content io.Reader) error {
	clean, err := CleanArchiveName(name)
	if err != nil {
		return err
	}
	if clean == "" {
		return fmt.Errorf("%w: %q does not name a file", ErrInvalidPath, name)
	}
	if size < 0 {
		return fmt.Errorf("%w: file size %d is negative", ErrInvalidRequest, size)
	}
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: clean, Mode: mode & 0o777, Size: size}); err != nil {
		return fmt.Errorf("writing the tar header for %q: %w", clean, err)
	}
	n, err := io.CopyN(tw, content, size)
	if err != nil {
		return fmt.Errorf("writing %q: got %d of %d bytes: %w", clean, n, size, err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("finishing the tar of %q: %w", clean, err)
	}
	return nil
}
