package snapshotstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Dir stores each snapshot as one file in a directory that only this
// process's user can read (0700; files 0600). A Put writes a temporary file
// and renames it into place once complete and synced, so a ref names
// either a whole snapshot or nothing. A ref is "dir:" and the file's random
// name; the key is not part of any path.
type Dir struct {
	root     *os.Root
	maxBytes int64
}

var dirRefRE = regexp.MustCompile(`^dir:snap-[0-9a-f]{32}\.tar$`)

// NewDir opens (creating it 0700 if missing) the directory path. A
// directory another user can enter is refused. maxBytes bounds every Put
// and Open (zero: DefaultMaxBytes).
func NewDir(path string, maxBytes int64) (*Dir, error) {
	if maxBytes < 0 {
		return nil, fmt.Errorf("snapshot store: maxBytes %d is negative", maxBytes)
	}
	if maxBytes == 0 {
		maxBytes = DefaultMaxBytes
	}
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot store: creating %s: %w", path, err)
	}
	info, err := os.Lstat(path)
	if err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("snapshot store: %s is not a directory", path)
	}
	if info.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("snapshot store: %s has mode %04o; it must be reachable by its owner only (0700)", path, info.Mode().Perm())
	}
	root, err := os.OpenRoot(path)
	if err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	return &Dir{root: root, maxBytes: maxBytes}, nil
}

// Close releases the directory.
func (d *Dir) Close() error { return d.root.Close() }

// Put implements Store.
func (d *Dir) Put(ctx context.Context, key string, r io.Reader) (string, int64, error) {
	if err := checkKey(key); err != nil {
		return "", 0, err
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", 0, err
	}
	name := "snap-" + hex.EncodeToString(b[:]) + ".tar"
	tmp := "." + name + ".part"
	f, err := d.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", 0, fmt.Errorf("snapshot store: %w", err)
	}
	done := false
	defer func() {
		if !done {
			f.Close()
			_ = d.root.Remove(tmp)
		}
	}()
	n, err := io.Copy(f, &capReader{r: ctxReader{ctx, r}, max: d.maxBytes})
	if err != nil {
		return "", n, fmt.Errorf("snapshot store: writing %s: %w", key, err)
	}
	if err := f.Sync(); err != nil {
		return "", n, fmt.Errorf("snapshot store: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", n, fmt.Errorf("snapshot store: %w", err)
	}
	done = true
	if err := d.root.Rename(tmp, name); err != nil {
		_ = d.root.Remove(tmp)
		return "", n, fmt.Errorf("snapshot store: %w", err)
	}
	return "dir:" + name, n, nil
}

// Open implements Store.
func (d *Dir) Open(_ context.Context, ref string) (io.ReadCloser, error) {
	name, err := d.name(ref)
	if err != nil {
		return nil, err
	}
	// O_NOFOLLOW through os.Root: the name is ours and never a link.
	f, err := d.root.Open(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, ref)
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() || st.Size() > d.maxBytes {
		f.Close()
		if err == nil && st.Size() > d.maxBytes {
			return nil, fmt.Errorf("%w: %s holds %d bytes, more than %d", ErrTooLarge, ref, st.Size(), d.maxBytes)
		}
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrInvalidRef, ref)
	}
	return readCloser{&capReader{r: f, max: d.maxBytes}, f}, nil
}

// Delete implements Store.
func (d *Dir) Delete(_ context.Context, ref string) error {
	name, err := d.name(ref)
	if err != nil {
		return err
	}
	if err := d.root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("snapshot store: %w", err)
	}
	return nil
}

func (d *Dir) name(ref string) (string, error) {
	if !dirRefRE.MatchString(ref) {
		return "", fmt.Errorf("%w: %q is not a reference of a directory store", ErrInvalidRef, ref)
	}
	return filepath.Base(ref[len("dir:"):]), nil
}

// keyRE is a repository path component grammar (OCI distribution spec),
// which also suits a log line: lower case, digits and single separators.
var keyRE = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$`)

func checkKey(key string) error {
	if len(key) == 0 || len(key) > 128 || !keyRE.MatchString(key) {
		return fmt.Errorf("%w: key %q must be 1-128 characters of lower case letters, digits, and '.', '_', '-' or '/' between them", ErrInvalidRef, key)
	}
	return nil
}

// ctxReader ends a copy when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// EntryKind is what a directory entry is.
type EntryKind string

const (
	// EntrySnapshot is a stored snapshot file (Ref is its dir: ref).
	EntrySnapshot EntryKind = "snapshot"
	// EntryPartial is the temporary file of a Put that has not finished
	// (or whose process died).
	EntryPartial EntryKind = "partial"
	// EntryPushed is a journal record of a registry ref this node pushed
	// (Ref is the registry ref).
	EntryPushed EntryKind = "pushed"
)

// Entry is one thing a Dir holds.
type Entry struct {
	Kind EntryKind
	// Ref is the snapshot's ref; empty for a partial file.
	Ref string
	// ModTime is when the file was last written.
	ModTime time.Time
	name    string
}

var (
	partialRE = regexp.MustCompile(`^\.snap-[0-9a-f]{32}\.tar\.part$`)
	pushedRE  = regexp.MustCompile(`^\.pushed-[0-9a-f]{64}$`)
)

// journalName is the file that records a pushed ref: a hash, so that the
// ref never becomes a path.
func journalName(ref string) string {
	sum := sha256.Sum256([]byte(ref))
	return ".pushed-" + hex.EncodeToString(sum[:])
}

// journal records ref, 0600, synced before the push it precedes.
func (d *Dir) journal(ref string) error {
	name := journalName(ref)
	f, err := d.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("snapshot store: journal: %w", err)
	}
	_, err = f.WriteString(ref)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = d.root.Remove(name)
		return fmt.Errorf("snapshot store: journal: %w", err)
	}
	return nil
}

func (d *Dir) unjournal(ref string) error {
	return d.removeName(journalName(ref))
}

func (d *Dir) removeName(name string) error {
	if !partialRE.MatchString(name) && !pushedRE.MatchString(name) {
		return fmt.Errorf("%w: %q is not a partial or journal file", ErrInvalidRef, name)
	}
	if err := d.root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("snapshot store: %w", err)
	}
	return nil
}

// maxJournalBytes bounds a journal file read: a ref is far shorter.
const maxJournalBytes = 4096

// entries lists the directory. Names of no known shape are left out (and
// alone); so is a journal file that does not hold a ref.
func (d *Dir) entries() ([]Entry, error) {
	f, err := d.root.Open(".")
	if err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	defer f.Close()
	des, err := f.ReadDir(-1)
	if err != nil {
		return nil, fmt.Errorf("snapshot store: listing: %w", err)
	}
	var out []Entry
	for _, de := range des {
		if !de.Type().IsRegular() {
			continue
		}
		info, err := de.Info()
		if err != nil {
			continue // removed meanwhile
		}
		name := de.Name()
		e := Entry{ModTime: info.ModTime(), name: name}
		switch {
		case dirRefRE.MatchString("dir:" + name):
			e.Kind, e.Ref = EntrySnapshot, "dir:"+name
		case partialRE.MatchString(name):
			e.Kind = EntryPartial
		case pushedRE.MatchString(name) && info.Size() <= maxJournalBytes:
			raw, err := d.root.ReadFile(name)
			if err != nil || journalName(string(raw)) != name || strings.TrimSpace(string(raw)) != string(raw) {
				continue
			}
			e.Kind, e.Ref = EntryPushed, string(raw)
		default:
			continue
		}
		out = append(out, e)
	}
	return out, nil
}
