// Package hostfs is the host side of sandbox file transfers, shared by
// `kubectl sandbox cp` and the MCP server's copy tools: it archives host
// trees for uploads and writes downloads onto the host.
//
// A download archive comes from a sandbox, that is from code nobody vetted
// (the helper that writes it runs inside the sandbox too). So the archive
// never decides what lands on the host; the caller's request does:
//
//   - The request says whether a file or a directory is wanted (see
//     ParseSource: a source ending in "/" or "/." asks for a directory,
//     anything else for a file). The archive's root entry must be of that
//     type, carry the requested name, and a file must be the archive's only
//     entry. Anything else is refused before the host is touched.
//   - Only regular files and directories are written. A symlink, hard link,
//     device, fifo or any other entry fails the whole download, naming it.
//     Names that are absolute, contain "..", or leave the root entry are
//     refused (execio.CleanArchiveName).
//   - A file lands at DEST, or at DEST/<name> when DEST is a directory. An
//     existing file is replaced only with Options.Overwrite; a directory,
//     symlink or anything else in the way is never replaced.
//   - A directory lands as a new DEST/<name>, or as DEST when DEST does not
//     exist. It is never merged into an existing directory and never
//     replaces anything, whatever Options.Overwrite says.
//   - Modes: files keep their read and write bits minus group and world
//     write (0o022); exec bits only with Options.KeepExec; setuid, setgid
//     and sticky never. The kernel then applies the process umask, because
//     every file and directory is created by open(2)/mkdir(2) with that
//     mode. Directories are created 0o755 (minus the umask). On Windows a
//     mode only decides the read-only attribute (no owner write bit: read
//     only); there is no umask and no exec bit.
//   - Everything is written under a temporary name next to its target and
//     renamed into place once complete, so a failed download leaves nothing
//     behind: a partial file is removed, a partial tree too, and so are the
//     parent directories of DEST that the download created.
//
// Every path is opened through an os.Root, so neither ".." nor a symlink
// (on Windows: nor a junction or any other reparse point) can lead a write
// outside it. Inside the root, this package follows none either: a link
// where a directory or a file is expected is refused (isLink), and every
// file is created with O_CREATE|O_EXCL, which never follows a link in the
// last component (POSIX open(2); on Windows os.Root opens it with
// FILE_OPEN_REPARSE_POINT, since Go 1.24.4, CVE-2025-0913). The rules are
// the same on every platform; only the file system underneath differs
// (docs/limitations.md says what is not tested on real Windows or macOS).
package hostfs

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
	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
)

// Errors a caller may branch on; they are always wrapped with a message
// naming the paths involved. Entries of the wrong kind wrap
// execio.ErrUnsupportedEntry, bad names execio.ErrInvalidPath and caps
// execio.ErrTooLarge.
var (
	// ErrExists: the download would replace or merge into something that
	// exists on the host.
	ErrExists = errors.New("the destination exists")
	// ErrWrongType: the archive (or the host destination) is not of the
	// kind the caller asked for.
	ErrWrongType = errors.New("type mismatch")
)

// Kind is what a download is asked to be.
type Kind int

const (
	// File: exactly one regular file.
	File Kind = iota + 1
	// Dir: a tree of regular files and directories.
	Dir
)

func (k Kind) String() string {
	switch k {
	case File:
		return "a file"
	case Dir:
		return "a directory"
	}
	return "nothing"
}

// Request is a download as the caller asked for it.
type Request struct {
	// Source is the sandbox path as the caller wrote it, for messages.
	Source string
	// Kind is what the caller wants.
	Kind Kind
	// Contents (directories only): the source was written as "DIR/." (or
	// "."), so the directory itself lands as DEST, which must not exist.
	Contents bool
	// Name is the archive's root entry name the caller expects (the
	// source's base name); empty accepts any single clean name.
	Name string
}

// ParseSource reads a download request from the sandbox path as the user
// wrote it, the way docker cp reads SRC_PATH, made strict:
//
//   - "DIR/." or "." asks for a directory whose contents become DEST;
//   - "DIR/" asks for a directory;
//   - anything else asks for a file.
func ParseSource(src string) Request {
	req := Request{Source: src, Kind: File}
	trimmed := strings.TrimRight(src, "/")
	if trimmed != src || trimmed == "" {
		req.Kind = Dir
	}
	if trimmed == "." || strings.HasSuffix(trimmed, "/.") {
		req.Kind, req.Contents = Dir, true
	}
	if base := path.Base(path.Clean("/" + trimmed)); base != "/" && base != "." && base != ".." {
		req.Name = base
	}
	return req
}

// Options are the caller's choices for a download.
type Options struct {
	// Overwrite allows replacing an existing regular file. Nothing else is
	// ever replaced, and directories are never merged.
	Overwrite bool
	// KeepExec keeps the files' exec bits.
	KeepExec bool
	// DestIsDir: DEST was written as a directory (with a trailing
	// separator); a missing one is created and the download lands inside.
	DestIsDir bool
	// MaxBytes caps the files' content, MaxEntries the number of entries;
	// zero means no cap.
	MaxBytes   int64
	MaxEntries int
	// Complete, if set, is called once the archive has been read and
	// checked, before anything is moved into place; an error aborts the
	// download and removes what it wrote. Download uses it to wait for the
	// end of the transfer, which may report a failure (a size cap hit
	// part-way) that the archive alone does not show.
	Complete func() error
}

// Result tells where a download landed and what it held.
type Result struct {
	// Path is where it landed, relative to the root, slash-separated.
	Path  string
	Kind  Kind
	Files int
	Dirs  int
	Bytes int64
}

// Extract writes the download archive r to dest (a path relative to root;
// "." is the root itself) as req asks. See the package documentation for
// the rules.
func Extract(root *os.Root, dest string, r io.Reader, req Request, opts Options) (Result, error) {
	if req.Kind != File && req.Kind != Dir {
		return Result{}, fmt.Errorf("hostfs: a download must ask for a file or a directory")
	}
	dest = path.Clean(filepath.ToSlash(dest))
	if dest != "." && !filepath.IsLocal(filepath.FromSlash(dest)) {
		return Result{}, fmt.Errorf("%w: the destination %q is not below the directory opened for it", execio.ErrInvalidPath, dest)
	}
	x := &extraction{root: root, tr: tar.NewReader(r), req: req, opts: opts}
	return x.run(dest)
}

type extraction struct {
	root *os.Root
	tr   *tar.Reader
	req  Request
	opts Options
	res  Result
	// entries counts the archive's entries (for MaxEntries).
	entries int
}

func (x *extraction) source() string {
	if x.req.Source == "" {
		return "the sandbox path"
	}
	return x.req.Source
}

// next returns the next header, skipping PAX global headers; nil at the
// end of the archive.
func (x *extraction) next() (*tar.Header, error) {
	for {
		h, err := x.tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading the sandbox's archive: %w", err)
		}
		if h.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		if x.entries++; x.opts.MaxEntries > 0 && x.entries > x.opts.MaxEntries {
			return nil, fmt.Errorf("%w: the download has more than %d entries", execio.ErrTooLarge, x.opts.MaxEntries)
		}
		return h, nil
	}
}

func (x *extraction) run(dest string) (Result, error) {
	// Everything about the archive's root is checked before the host is
	// touched.
	hdr, err := x.next()
	if err != nil {
		return x.res, err
	}
	if hdr == nil {
		return x.res, fmt.Errorf("the sandbox sent an empty archive for %s; nothing was written", x.source())
	}
	name, err := execio.CleanArchiveName(hdr.Name)
	if err != nil {
		return x.res, fmt.Errorf("refusing the download of %s: %w", x.source(), err)
	}
	if name == "" || strings.Contains(name, "/") {
		return x.res, fmt.Errorf("%w: refusing the download of %s: the archive's first entry %q is not a single name", execio.ErrInvalidPath, x.source(), hdr.Name)
	}
	if x.req.Name != "" && name != x.req.Name {
		return x.res, fmt.Errorf("%w: refusing the download of %s: the archive's first entry is %q, not %q", ErrWrongType, x.source(), name, x.req.Name)
	}
	kind, err := execio.EntryKind(hdr)
	if err != nil {
		return x.res, fmt.Errorf("refusing the download of %s: %w; nothing was written", x.source(), err)
	}
	got := File
	if kind == "dir" {
		got = Dir
	}
	if got != x.req.Kind {
		hint := "write the source with a trailing / to copy a directory"
		if x.req.Kind == Dir {
			hint = "write the source without a trailing / to copy a file"
		}
		return x.res, fmt.Errorf("%w: %s is %s in the sandbox, but %s was asked for (%s); nothing was written", ErrWrongType, x.source(), got, x.req.Kind, hint)
	}
	x.res.Kind = got

	target, err := x.target(dest, name)
	if err != nil {
		return x.res, err
	}
	x.res.Path = target
	created, err := mkdirParents(x.root, path.Dir(target))
	if err == nil && got == File {
		err = x.file(hdr, target)
	} else if err == nil {
		err = x.tree(name, target)
	}
	if err != nil {
		// Parents of DEST the download created go too (only if empty).
		for i := len(created) - 1; i >= 0; i-- {
			_ = x.root.Remove(created[i])
		}
		return x.res, err
	}
	return x.res, nil
}

// target decides where the download lands, from the request and what
// exists on the host, and refuses to replace or merge into anything.
func (x *extraction) target(dest, name string) (string, error) {
	fi, err := x.root.Lstat(dest)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("checking the destination %s: %w", dest, err)
	}
	if exists && isLink(fi.Mode()) {
		return "", fmt.Errorf("%w: the destination %s is %s; downloads never write through one", ErrExists, dest, describeMode(fi.Mode()))
	}
	target := dest
	switch {
	case x.req.Contents:
		if exists {
			return "", fmt.Errorf("%w: %s exists; the contents of %s are copied only into a new directory, never merged into an existing one (name a path that does not exist)", ErrExists, dest, x.source())
		}
	case exists && fi.IsDir(), x.opts.DestIsDir:
		if exists && !fi.IsDir() {
			return "", fmt.Errorf("%w: the destination %s is not a directory", ErrWrongType, dest)
		}
		target = path.Join(dest, name)
	case exists && x.req.Kind == Dir:
		return "", fmt.Errorf("%w: cannot copy the directory %s to %s, an existing file", ErrWrongType, x.source(), dest)
	}
	if target == "." {
		return "", fmt.Errorf("%w: the download has no name to land under", execio.ErrInvalidPath)
	}
	fi, err = x.root.Lstat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return target, nil
	case err != nil:
		return "", fmt.Errorf("checking %s: %w", target, err)
	case x.req.Kind == Dir:
		return "", fmt.Errorf("%w: %s exists; a directory is only ever copied to a new path, never merged into or over an existing one (remove it or name another destination)", ErrExists, target)
	case !fi.Mode().IsRegular():
		return "", fmt.Errorf("%w: %s exists and is %s; only a regular file is ever replaced", ErrExists, target, describeMode(fi.Mode()))
	case !x.opts.Overwrite:
		return "", fmt.Errorf("%w: %s exists; ask to overwrite it to replace it", ErrExists, target)
	}
	return target, nil
}

// isLink tells an entry that leads elsewhere: a symbolic link, or on
// Windows a junction (mount point) or another name-surrogate reparse point,
// which Go reports as ModeIrregular (Go 1.23+; as ModeSymlink with
// GODEBUG=winsymlink=0). Such an entry is never written through, never
// replaced and never taken for a directory. Go's Lstat never sets ModeDir
// on either, so checks by IsDir refuse them too; isLink makes the refusal
// name what is in the way.
func isLink(m fs.FileMode) bool {
	return m&(fs.ModeSymlink|fs.ModeIrregular) != 0
}

func describeMode(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m&fs.ModeIrregular != 0:
		return "a junction or another link (reparse point)"
	}
	return "not a regular file (" + m.Type().String() + ")"
}

// fileMode is the mode a downloaded file is created with (the kernel then
// applies the umask).
func (x *extraction) fileMode(hdr *tar.Header) os.FileMode {
	m := os.FileMode(hdr.Mode).Perm() &^ 0o022
	if !x.opts.KeepExec {
		m &^= 0o111
	}
	return m
}

// dirMode is the mode directories are created with, before the umask.
const dirMode os.FileMode = 0o755

func (x *extraction) account(hdr *tar.Header) error {
	if hdr.Size < 0 || (x.opts.MaxBytes > 0 && hdr.Size > x.opts.MaxBytes-x.res.Bytes) {
		return fmt.Errorf("%w: %q (%d bytes) takes the download past its %d-byte limit", execio.ErrTooLarge, hdr.Name, hdr.Size, x.opts.MaxBytes)
	}
	return nil
}

// file writes the archive's single file to target.
func (x *extraction) file(hdr *tar.Header, target string) error {
	if err := x.account(hdr); err != nil {
		return err
	}
	tmp := tempName(target)
	if err := x.writeFile(tmp, hdr); err != nil {
		_ = x.root.Remove(tmp)
		return fmt.Errorf("writing %s: %w", target, err)
	}
	// The file must be the archive's only entry: an archive that claims a
	// file and then carries more is refused, not half taken.
	more, err := x.next()
	if err == nil && more != nil {
		err = fmt.Errorf("%w: refusing the download of %s: the archive holds %q after the file %q; a file download is exactly one regular file", ErrWrongType, x.source(), more.Name, hdr.Name)
	}
	if err == nil && x.opts.Complete != nil {
		err = x.opts.Complete()
	}
	if err == nil {
		err = x.commitFile(tmp, target)
	}
	if err != nil {
		_ = x.root.Remove(tmp)
		return err
	}
	x.res.Files, x.res.Bytes = 1, hdr.Size
	return nil
}

// commitFile moves the complete file tmp to target: without Overwrite by a
// hard link, which fails if target appeared meanwhile; with it by a rename,
// which replaces a regular file (target was checked to be one).
func (x *extraction) commitFile(tmp, target string) error {
	if x.opts.Overwrite {
		if fi, err := x.root.Lstat(target); err == nil && !fi.Mode().IsRegular() {
			return fmt.Errorf("%w: %s is now %s; only a regular file is ever replaced", ErrExists, target, describeMode(fi.Mode()))
		}
		if err := x.root.Rename(tmp, target); err != nil {
			return fmt.Errorf("moving the download into place at %s: %w", target, err)
		}
		return nil
	}
	err := x.root.Link(tmp, target)
	switch {
	case err == nil:
		_ = x.root.Remove(tmp)
		return nil
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("%w: %s appeared during the download; ask to overwrite it to replace it", ErrExists, target)
	}
	// A filesystem without hard links: check, then rename.
	if _, lerr := x.root.Lstat(target); !errors.Is(lerr, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s appeared during the download; ask to overwrite it to replace it", ErrExists, target)
	}
	if err := x.root.Rename(tmp, target); err != nil {
		return fmt.Errorf("moving the download into place at %s: %w", target, err)
	}
	return nil
}

// writeFile creates name (which must not exist) with the entry's content.
// O_CREATE|O_EXCL fails on anything at name, a link included, without
// following it, on every platform (see the package documentation), so no
// O_NOFOLLOW is needed (Windows has none; os.Root adds it on Unix anyway).
func (x *extraction) writeFile(name string, hdr *tar.Header) error {
	f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, x.fileMode(hdr))
	if err != nil {
		return err
	}
	_, err = io.CopyN(f, x.tr, hdr.Size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if !hdr.ModTime.IsZero() {
		_ = x.root.Chtimes(name, hdr.ModTime, hdr.ModTime)
	}
	return nil
}

// tree extracts a directory archive whose root entry is top into a fresh
// temporary directory next to target, then renames it into place.
// rename(2) of a directory never merges: it fails if target appeared and
// holds anything.
func (x *extraction) tree(top, target string) error {
	tmp := tempName(target)
	if err := x.root.Mkdir(tmp, dirMode); err != nil {
		return fmt.Errorf("creating %s: %w", target, err)
	}
	x.res.Dirs = 1
	err := x.treeEntries(top, tmp)
	if err == nil && x.opts.Complete != nil {
		err = x.opts.Complete()
	}
	if err == nil {
		if _, lerr := x.root.Lstat(target); !errors.Is(lerr, fs.ErrNotExist) {
			err = fmt.Errorf("%w: %s appeared during the download; a directory is never merged into an existing one", ErrExists, target)
		} else if rerr := x.root.Rename(tmp, target); rerr != nil {
			err = fmt.Errorf("moving the download into place at %s: %w", target, rerr)
		}
	}
	if err != nil {
		_ = x.root.RemoveAll(tmp)
		x.res.Files, x.res.Dirs, x.res.Bytes = 0, 0, 0
		return err
	}
	return nil
}

func (x *extraction) treeEntries(top, tmp string) error {
	for {
		hdr, err := x.next()
		if err != nil || hdr == nil {
			return err
		}
		name, err := execio.CleanArchiveName(hdr.Name)
		if err != nil {
			return fmt.Errorf("refusing the download of %s: %w", x.source(), err)
		}
		rel, below := strings.CutPrefix(name, top+"/")
		if name == top {
			rel, below = "", true
		}
		if !below {
			return fmt.Errorf("%w: refusing the download of %s: archive entry %q is not below %q", execio.ErrInvalidPath, x.source(), hdr.Name, top)
		}
		kind, err := execio.EntryKind(hdr)
		if err != nil {
			return fmt.Errorf("refusing the download of %s: %w", x.source(), err)
		}
		if kind == "skip" {
			continue
		}
		if rel == "" {
			if kind != "dir" {
				return fmt.Errorf("%w: refusing the download of %s: the archive holds a file %q where its top directory is", ErrWrongType, x.source(), hdr.Name)
			}
			continue
		}
		out := path.Join(tmp, rel)
		if kind == "dir" {
			if err := x.mkdirAll(out); err != nil {
				return fmt.Errorf("creating %s: %w", rel, err)
			}
			continue
		}
		if err := x.account(hdr); err != nil {
			return err
		}
		if err := x.mkdirAll(path.Dir(out)); err != nil {
			return fmt.Errorf("creating %s: %w", path.Dir(rel), err)
		}
		if err := x.writeFile(out, hdr); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("%w: refusing the download of %s: the archive holds %q twice", execio.ErrInvalidPath, x.source(), hdr.Name)
			}
			return fmt.Errorf("writing %s: %w", rel, err)
		}
		x.res.Files++
		x.res.Bytes += hdr.Size
	}
}

// mkdirAll creates dir and its missing parents (inside the temporary
// tree), counting them.
func (x *extraction) mkdirAll(dir string) error {
	created, err := mkdirParents(x.root, dir)
	x.res.Dirs += len(created)
	return err
}

// mkdirParents creates dir and any missing parent, returning those it
// created, outermost first. Something other than a directory in the way is
// an error.
func mkdirParents(root *os.Root, dir string) ([]string, error) {
	if dir == "." || dir == "" {
		return nil, nil
	}
	var created []string
	p := ""
	for _, comp := range strings.Split(dir, "/") {
		p = path.Join(p, comp)
		fi, err := root.Lstat(p)
		switch {
		case err == nil && fi.IsDir():
			continue
		case err == nil:
			return created, fmt.Errorf("%w: %s is %s, not a directory", ErrWrongType, p, describeMode(fi.Mode()))
		case !errors.Is(err, fs.ErrNotExist):
			return created, err
		}
		if err := root.Mkdir(p, dirMode); err != nil {
			return created, fmt.Errorf("creating %s: %w", p, err)
		}
		created = append(created, p)
	}
	return created, nil
}

// tempName is a hidden name next to target for writing it.
func tempName(target string) string {
	base := path.Base(target)
	if len(base) > 200 {
		base = base[:200]
	}
	return path.Join(path.Dir(target), "."+base+".partial-"+randid.Hex(6))
}

// errStopped ends a download whose extraction failed.
var errStopped = errors.New("the download was abandoned on the host")

// Download runs download, which writes a download archive to w, and
// extracts what it writes with Extract. Nothing is moved into place before
// download has returned without error. The error returned is download's
// when the transfer itself failed, Extract's otherwise.
func Download(root *os.Root, dest string, req Request, opts Options, download func(w io.Writer) error) (Result, error) {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := download(pw)
		pw.CloseWithError(err)
		done <- err
	}()
	var dlErr error
	waited := false
	wait := func() error {
		if !waited {
			dlErr, waited = <-done, true
		}
		return dlErr
	}
	complete := opts.Complete
	opts.Complete = func() error {
		// The archive's end marker may come before the end of the
		// transfer, whose late failure (an HTTP trailer, say) arrives only
		// after it.
		_, _ = io.Copy(io.Discard, pr)
		if err := wait(); err != nil {
			return err
		}
		if complete != nil {
			return complete()
		}
		return nil
	}
	res, err := Extract(root, dest, pr, req, opts)
	if err != nil {
		pr.CloseWithError(fmt.Errorf("%w: %w", errStopped, err))
	}
	derr := wait()
	switch {
	case derr == nil:
		return res, err
	case errors.Is(derr, errStopped) || strings.Contains(derr.Error(), errStopped.Error()):
		// The transfer failed because the extraction stopped reading.
		return res, err
	case refusal(err) && !errors.Is(err, derr):
		// The host refused what it was sent; a backend may have reported
		// the broken pipe that followed in its own words.
		return res, err
	}
	return res, derr
}

// refusal tells a download refused by the host's rules from one that
// failed for another reason.
func refusal(err error) bool {
	for _, e := range []error{ErrWrongType, ErrExists, execio.ErrUnsupportedEntry, execio.ErrInvalidPath, execio.ErrTooLarge} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
