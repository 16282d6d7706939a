// Package history records the commands run in each sandbox (what, when, by
// whom, and how it ended) so that `logs` can show them next to the
// container's own output. Records are appended to one JSON-lines file per
// sandbox, so they survive a restart of the process that serves them; an
// empty directory keeps them in memory instead.
//
// Memory is bounded whatever the sandbox does: a recorded command (and
// error) is cut to MaxCommandBytes with a marker, a sandbox keeps at most
// MaxRecords records and MaxBytes bytes, tails are read backwards from the
// end of the file in fixed-size blocks, and a line that cannot be decoded
// (torn, corrupt, or longer than MaxLineBytes, as an older version could
// write) is skipped without losing the records after it.
package history

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Record is one finished (or failed) command.
type Record struct {
	// ID identifies the exec; it is unique within a sandbox.
	ID string `json:"id"`
	// Command and Shell are what was run, cut to MaxCommandBytes in all
	// (CommandTruncated then says so and a marker shows where).
	Command    []string  `json:"command,omitempty"`
	Shell      string    `json:"shell,omitempty"`
	WorkingDir string    `json:"workingDir,omitempty"`
	StartedAt  time.Time `json:"startedAt"`
	// DurationMillis is the wall time of the command.
	DurationMillis int64 `json:"durationMillis"`
	ExitCode       int   `json:"exitCode"`
	TimedOut       bool  `json:"timedOut,omitempty"`
	Truncated      bool  `json:"truncated,omitempty"`
	// CommandTruncated: Command or Shell was longer than MaxCommandBytes
	// and was cut.
	CommandTruncated bool `json:"commandTruncated,omitempty"`
	// Error says why the command did not run to completion (Docker went
	// away, the caller disconnected…); empty when it did.
	Error string `json:"error,omitempty"`
	// Caller is the authenticated user who ran it, when known.
	Caller string `json:"caller,omitempty"`
}

const (
	// DefaultMaxRecords is how many records a sandbox keeps.
	DefaultMaxRecords = 1000
	// DefaultMaxBytes is how many bytes of records (as JSON lines) a
	// sandbox keeps. The file may grow to twice this before it is
	// compacted.
	DefaultMaxBytes int64 = 2 << 20
	// MaxCommandBytes caps the recorded command (the sum of its
	// arguments, or the shell line); the same cap applies to Error and
	// to the other strings of a record.
	MaxCommandBytes = 4 << 10
	// MaxLineBytes is the longest line a reader accepts; a longer one
	// (which this version never writes) is read as UnreadableID.
	MaxLineBytes = 64 << 10
	// readBlock is how much of a file a tail reads at a time.
	readBlock = 32 << 10
)

// ErrInvalidKey: a key that cannot name a file safely.
var ErrInvalidKey = errors.New("invalid history key")

var validKey = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

// Limits bound what a Store keeps per sandbox. Zero fields take the
// defaults.
type Limits struct {
	MaxRecords int
	MaxBytes   int64
}

// Store keeps the records of many sandboxes, keyed by sandbox UID (or any
// other identifier made of letters, digits, '.', '_' and '-').
//
// Each key has a lock of its own, held while its file is read or written;
// the store-wide lock only finds a key's state and is never held across
// disk I/O, so a slow or large read of one sandbox's history never holds
// up another's appends or reads.
type Store struct {
	dir      string
	max      int
	maxBytes int64

	mu   sync.Mutex
	keys map[string]*keyState
}

// keyState is one key's records, file state and followers. mu guards
// everything but refs, which Store.mu guards.
type keyState struct {
	mu        sync.Mutex
	refs      int
	file      fileState // the file's record count and size, when fileKnown
	fileKnown bool
	memory    []memRecord
	// subs are the followers: each one's records, and a channel closed
	// when the key is deleted.
	subs map[chan Record]chan struct{}
}

// unused reports whether ks holds nothing worth keeping once no caller
// refers to it.
func (ks *keyState) unused() bool {
	return !ks.fileKnown && len(ks.memory) == 0 && len(ks.subs) == 0
}

// lock returns key's state, locked; unlock releases it and forgets it if
// nothing refers to it any more. Store.mu is held only to find or create
// the state, never while waiting for a key's lock, so a key busy with a
// long read never blocks another key.
func (s *Store) lock(key string) (ks *keyState, unlock func()) {
	s.mu.Lock()
	ks = s.keys[key]
	if ks == nil {
		ks = &keyState{}
		s.keys[key] = ks
	}
	ks.refs++
	s.mu.Unlock()
	ks.mu.Lock()
	return ks, func() {
		// Lock order: a key's lock, then the store's; never the reverse.
		s.mu.Lock()
		if ks.refs--; ks.refs == 0 && ks.unused() {
			delete(s.keys, key)
		}
		s.mu.Unlock()
		ks.mu.Unlock()
	}
}

type fileState struct {
	count int
	size  int64
}

type memRecord struct {
	Record
	size int64
}

// New returns a store that keeps files in dir (created if missing), or keeps
// records in memory when dir is empty. maxRecords ≤ 0 means
// DefaultMaxRecords; the byte cap is DefaultMaxBytes.
func New(dir string, maxRecords int) (*Store, error) {
	return NewWithLimits(dir, Limits{MaxRecords: maxRecords})
}

// NewWithLimits is New with a byte cap as well.
func NewWithLimits(dir string, l Limits) (*Store, error) {
	if l.MaxRecords <= 0 {
		l.MaxRecords = DefaultMaxRecords
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("creating history directory: %w", err)
		}
	}
	return &Store{
		dir:      dir,
		max:      l.MaxRecords,
		maxBytes: l.MaxBytes,
		keys:     map[string]*keyState{},
	}, nil
}

func checkKey(key string) error {
	if !validKey.MatchString(key) || key == "." || key == ".." {
		return fmt.Errorf("%w: %q", ErrInvalidKey, key)
	}
	return nil
}

func (s *Store) file(key string) string { return filepath.Join(s.dir, key+".jsonl") }

// Bound returns r with its command, shell, working directory, error and
// caller cut to MaxCommandBytes, each cut marked. Append applies it; a
// caller may apply it earlier to drop a large command sooner.
func Bound(r Record) Record { return boundTo(r, MaxCommandBytes) }

// boundTo cuts each string of r to limit bytes. An argument counts with
// its JSON overhead (quotes and comma), so that thousands of empty
// arguments are cut too: without that, 30,000 of them made a record longer
// than MaxLineBytes, which readers skipped.
func boundTo(r Record, limit int) Record {
	if n := commandBytes(r.Command); n > limit {
		r.Command, r.CommandTruncated = truncateArgs(r.Command, n, limit), true
	}
	if len(r.Shell) > limit {
		r.Shell, r.CommandTruncated = truncateString(r.Shell, "command", limit), true
	}
	r.WorkingDir = truncateString(r.WorkingDir, "working directory", limit)
	r.Error = truncateString(r.Error, "error", limit)
	r.Caller = truncateString(r.Caller, "caller", limit)
	return r
}

// argOverhead is what an argument costs in a record beyond its bytes: its
// quotes and the comma after it.
const argOverhead = 3

func commandBytes(args []string) int {
	n := 0
	for _, a := range args {
		n += len(a) + argOverhead
	}
	return n
}

// CommandMarker is appended where a recorded command is cut.
func CommandMarker(what string, total int) string {
	return commandMarker(what, MaxCommandBytes, total)
}

func commandMarker(what string, limit, total int) string {
	return fmt.Sprintf("…[code-sandbox: %s truncated to %d of %d bytes]", what, limit, total)
}

func truncateString(s, what string, limit int) string {
	if len(s) <= limit {
		return s
	}
	return cutUTF8(s, limit) + commandMarker(what, limit, len(s))
}

// truncateArgs keeps the first limit bytes of args (each counted with
// argOverhead), cutting the argument that crosses the cap and dropping
// those after it, and ends with the marker as an argument of its own.
func truncateArgs(args []string, total, limit int) []string {
	out := make([]string, 0, 4)
	room := limit
	for _, a := range args {
		if len(a)+argOverhead > room {
			if room > argOverhead {
				out = append(out, cutUTF8(a, room-argOverhead))
			}
			break
		}
		out = append(out, a)
		room -= len(a) + argOverhead
	}
	// The kept strings are copied so that the record does not pin the
	// request's (possibly huge) backing array.
	for i, a := range out {
		out[i] = strings.Clone(a)
	}
	return append(out, commandMarker("command", limit, total))
}

// cutUTF8 returns a copy of the first at most n bytes of s, not splitting
// a UTF-8 sequence.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return strings.Clone(s[:n])
}

// UnreadableID is the ID of the placeholder shown for a record longer than
// MaxLineBytes (written by an older version).
const UnreadableID = "unreadable"

func unreadableRecord() Record {
	return Record{ID: UnreadableID, ExitCode: -1, CommandTruncated: true,
		Error: fmt.Sprintf("this history record is longer than %d bytes and cannot be shown", MaxLineBytes)}
}

// Append adds a record and wakes every follower of key. The oldest records
// beyond the store's maximum count or bytes are dropped.
func (s *Store) Append(key string, r Record) error {
	if err := checkKey(key); err != nil {
		return err
	}
	r = Bound(r)
	line, err := json.Marshal(r)
	if err == nil && len(line) > MaxLineBytes {
		// JSON escaping can grow a string sixfold (\u0001): cut harder so
		// that the line stays readable.
		r = boundTo(r, MaxCommandBytes/8)
		line, err = json.Marshal(r)
	}
	if err != nil {
		return fmt.Errorf("encoding history record: %w", err)
	}
	ks, unlock := s.lock(key)
	defer unlock()
	if s.dir == "" {
		s.appendMemory(ks, memRecord{Record: r, size: int64(len(line)) + 1})
	} else if err := s.appendFile(ks, key, line); err != nil {
		return err
	}
	for ch := range ks.subs {
		select {
		case ch <- r:
		default:
			// A follower that does not keep up is dropped rather than
			// allowed to block every exec on this sandbox.
			close(ch)
			delete(ks.subs, ch)
		}
	}
	return nil
}

func (s *Store) appendMemory(ks *keyState, r memRecord) {
	recs := append(ks.memory, r)
	var total int64
	keep := 0
	for i := len(recs) - 1; i >= 0 && keep < s.max; i-- {
		if total+recs[i].size > s.maxBytes && keep > 0 {
			break
		}
		total += recs[i].size
		keep++
	}
	if keep < len(recs) {
		recs = append([]memRecord(nil), recs[len(recs)-keep:]...)
	}
	ks.memory = recs
}

func (s *Store) appendFile(ks *keyState, key string, line []byte) error {
	path := s.file(key)
	st := ks.file
	if !ks.fileKnown {
		var err error
		if st, err = countLines(path); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("opening history file: %w", err)
	}
	buf := make([]byte, 0, len(line)+2)
	if torn, err := endsTorn(f); err != nil {
		_ = f.Close()
		return err
	} else if torn {
		// A crash mid-write left a partial line: end it, so that this
		// record is a line of its own and not glued to the torn one.
		buf = append(buf, '\n')
	}
	buf = append(append(buf, line...), '\n')
	_, werr := f.Write(buf)
	var size int64
	if werr == nil {
		var fi os.FileInfo
		if fi, werr = f.Stat(); werr == nil {
			size = fi.Size()
		}
	}
	cerr := f.Close()
	if werr != nil || cerr != nil {
		ks.fileKnown = false
		return fmt.Errorf("writing history file %s: %w", path, errors.Join(werr, cerr))
	}
	st.count++
	st.size = size
	// Compact only when twice over a limit, so appends stay O(1) on
	// average.
	if st.count > 2*s.max || st.size > 2*s.maxBytes {
		recs, err := s.readTail(path, s.max)
		if err != nil {
			ks.fileKnown = false
			return err
		}
		if st, err = writeFile(path, recs); err != nil {
			ks.fileKnown = false
			return err
		}
	}
	ks.file, ks.fileKnown = st, true
	return nil
}

// endsTorn reports whether f is non-empty and does not end in a newline.
func endsTorn(f *os.File) (bool, error) {
	fi, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("reading history file: %w", err)
	}
	if fi.Size() == 0 {
		return false, nil
	}
	var last [1]byte
	if _, err := f.ReadAt(last[:], fi.Size()-1); err != nil {
		return false, fmt.Errorf("reading history file: %w", err)
	}
	return last[0] != '\n', nil
}

// countLines counts the lines of path (and its size) reading it in
// fixed-size blocks, so that a file left by an older version, however
// large its lines, costs no memory.
func countLines(path string) (fileState, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return fileState{}, nil
	}
	if err != nil {
		return fileState{}, fmt.Errorf("reading history file: %w", err)
	}
	defer f.Close()
	var st fileState
	buf := make([]byte, readBlock)
	for {
		n, err := f.Read(buf)
		st.count += bytes.Count(buf[:n], []byte{'\n'})
		st.size += int64(n)
		if err == io.EOF {
			return st, nil
		}
		if err != nil {
			return fileState{}, fmt.Errorf("reading history file: %w", err)
		}
	}
}

// readTail returns the last n (≤ s.max) records of path, oldest first,
// within s.maxBytes, reading the file backwards from its end in blocks. A
// line that does not decode, or is longer than MaxLineBytes, is skipped.
func (s *Store) readTail(path string, n int) ([]Record, error) {
	if n <= 0 || n > s.max {
		n = s.max
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading history file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading history file: %w", err)
	}
	var (
		recs  []Record // newest first
		total int64
	)
	err = scanBackward(f, fi.Size(), MaxLineBytes, func(line []byte, oversize bool) bool {
		if oversize {
			// Shown as a placeholder, not skipped: a reader should see that
			// a command ran here even if its record cannot be read.
			r := unreadableRecord()
			b, _ := json.Marshal(r)
			if size := int64(len(b)) + 1; total+size <= s.maxBytes || len(recs) == 0 {
				recs = append(recs, r)
				total += size
			}
			return len(recs) < n
		}
		if len(line) == 0 {
			return true
		}
		size := int64(len(line)) + 1
		if total+size > s.maxBytes && len(recs) > 0 {
			return false
		}
		var r Record
		if json.Unmarshal(line, &r) != nil || r.ID == "" {
			// A torn or corrupt line: skipped, not fatal.
			return true
		}
		recs = append(recs, Bound(r))
		total += size
		return len(recs) < n
	})
	if err != nil {
		return nil, fmt.Errorf("reading history file: %w", err)
	}
	for i, j := 0, len(recs)-1; i < j; i, j = i+1, j-1 {
		recs[i], recs[j] = recs[j], recs[i]
	}
	return recs, nil
}

// scanBackward calls fn with each line of the first size bytes of r, the
// last line first, until fn returns false. It holds one block and at most
// maxLine bytes of a line at a time; a longer line is not read: fn gets
// it as (nil, true). A last line without its newline (torn by a crash) is
// passed as well; fn is expected to reject what does not decode.
func scanBackward(r io.ReaderAt, size int64, maxLine int, fn func(line []byte, oversize bool) bool) error {
	block := make([]byte, readBlock)
	var (
		partial  []byte // the end of the line being assembled, which starts further left
		oversize bool   // the line being assembled is too long and is skipped
	)
	pos := size
	for pos > 0 {
		n := int64(len(block))
		if n > pos {
			n = pos
		}
		pos -= n
		b := block[:n]
		if _, err := r.ReadAt(b, pos); err != nil && err != io.EOF {
			return err
		}
		end := len(b)
		for {
			i := bytes.LastIndexByte(b[:end], '\n')
			if i < 0 {
				break
			}
			// b[i+1:end] + partial is a whole line.
			if !oversize {
				var line []byte
				if len(partial) == 0 {
					line = b[i+1 : end]
				} else {
					line = append(append(make([]byte, 0, end-i-1+len(partial)), b[i+1:end]...), partial...)
				}
				if len(line) <= maxLine && !fn(line, false) {
					return nil
				}
				if len(line) > maxLine && !fn(nil, true) {
					return nil
				}
			} else if !fn(nil, true) {
				return nil
			}
			partial, oversize = partial[:0], false
			end = i
		}
		if oversize {
			continue
		}
		if end+len(partial) > maxLine {
			partial, oversize = partial[:0], true
			continue
		}
		partial = append(append(make([]byte, 0, end+len(partial)), b[:end]...), partial...)
	}
	if oversize {
		fn(nil, true)
	} else if len(partial) > 0 {
		fn(partial, false)
	}
	return nil
}

// writeFile replaces path with recs, through a temporary file and a
// rename, so that a crash leaves either the old file or the new one.
func writeFile(path string, recs []Record) (fileState, error) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fileState{}, fmt.Errorf("compacting history file: %w", err)
	}
	w := bufio.NewWriter(f)
	st := fileState{count: len(recs)}
	for _, r := range recs {
		line, err := json.Marshal(r)
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
			return fileState{}, fmt.Errorf("compacting history file: %w", err)
		}
		_, _ = w.Write(line)
		_ = w.WriteByte('\n')
		st.size += int64(len(line)) + 1
	}
	err = w.Flush()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fileState{}, fmt.Errorf("compacting history file: %w", err)
	}
	return st, nil
}

// Tail returns the last n records of key, oldest first; n ≤ 0 means all
// that are kept.
func (s *Store) Tail(key string, n int) ([]Record, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	ks, unlock := s.lock(key)
	defer unlock()
	return s.tailLocked(ks, key, n)
}

// tailLocked is Tail with key's lock held (ks is its state).
func (s *Store) tailLocked(ks *keyState, key string, n int) ([]Record, error) {
	if n <= 0 || n > s.max {
		n = s.max
	}
	if s.dir != "" {
		return s.readTail(s.file(key), n)
	}
	mem := ks.memory
	if len(mem) > n {
		mem = mem[len(mem)-n:]
	}
	recs := make([]Record, len(mem))
	for i := range mem {
		recs[i] = mem[i].Record
	}
	return recs, nil
}

// ErrDeleted ends a Follow whose key was deleted (its sandbox is gone).
var ErrDeleted = errors.New("the history was deleted with its sandbox")

// Follow calls fn with the last tail records of key (all when tail ≤ 0),
// then with each new record as it is appended, until ctx ends, fn returns
// an error, or key is deleted (ErrDeleted). It returns nil when ctx ends.
func (s *Store) Follow(ctx context.Context, key string, tail int, fn func(Record) error) error {
	if err := checkKey(key); err != nil {
		return err
	}
	ch := make(chan Record, 256)
	deleted := make(chan struct{})
	ks, unlock := s.lock(key)
	// Subscribing under the same lock as the snapshot means no record is
	// missed or repeated between the two.
	recs, err := s.tailLocked(ks, key, tail)
	if err != nil {
		unlock()
		return err
	}
	if ks.subs == nil {
		ks.subs = map[chan Record]chan struct{}{}
	}
	ks.subs[ch] = deleted
	unlock()
	defer s.unsubscribe(key, ch)

	for _, r := range recs {
		if err := fn(r); err != nil {
			return err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-deleted:
			return ErrDeleted
		case r, ok := <-ch:
			if !ok {
				return errors.New("history follower fell behind and was dropped")
			}
			if err := fn(r); err != nil {
				return err
			}
		}
	}
}

func (s *Store) unsubscribe(key string, ch chan Record) {
	ks, unlock := s.lock(key)
	defer unlock()
	delete(ks.subs, ch)
}

// Delete forgets key's records (when its sandbox is gone) and ends its
// followers with ErrDeleted.
func (s *Store) Delete(key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	ks, unlock := s.lock(key)
	defer unlock()
	ks.memory, ks.fileKnown = nil, false
	for ch, deleted := range ks.subs {
		close(deleted)
		delete(ks.subs, ch)
	}
	if s.dir != "" {
		if err := os.Remove(s.file(key)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing history file: %w", err)
		}
	}
	return nil
}
