// Package history records the commands run in each sandbox (what, when, by
// whom, and how it ended) so that `logs` can show them next to the
// container's own output. Records are appended to one JSON-lines file per
// sandbox, so they survive a restart of the process that serves them; an
// empty directory keeps them in memory instead.
package history

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"
)

// Record is one finished (or failed) command.
type Record struct {
	// ID identifies the exec; it is unique within a sandbox.
	ID         string    `json:"id"`
	Command    []string  `json:"command,omitempty"`
	Shell      string    `json:"shell,omitempty"`
	WorkingDir string    `json:"workingDir,omitempty"`
	StartedAt  time.Time `json:"startedAt"`
	// DurationMillis is the wall time of the command.
	DurationMillis int64 `json:"durationMillis"`
	ExitCode       int   `json:"exitCode"`
	TimedOut       bool  `json:"timedOut,omitempty"`
	Truncated      bool  `json:"truncated,omitempty"`
	// Error says why the command did not run to completion (Docker went
	// away, the caller disconnected…); empty when it did.
	Error string `json:"error,omitempty"`
	// Caller is the authenticated user who ran it, when known.
	Caller string `json:"caller,omitempty"`
}

// DefaultMaxRecords is how many records a sandbox keeps.
const DefaultMaxRecords = 1000

// ErrInvalidKey: a key that cannot name a file safely.
var ErrInvalidKey = errors.New("invalid history key")

var validKey = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

// Store keeps the records of many sandboxes, keyed by sandbox UID (or any
// other identifier made of letters, digits, '.', '_' and '-').
type Store struct {
	dir string
	max int

	mu     sync.Mutex
	counts map[string]int // records in each file, once known
	memory map[string][]Record
	subs   map[string]map[chan Record]struct{}
}

// New returns a store that keeps files in dir (created if missing), or keeps
// records in memory when dir is empty. maxRecords ≤ 0 means
// DefaultMaxRecords.
func New(dir string, maxRecords int) (*Store, error) {
	if maxRecords <= 0 {
		maxRecords = DefaultMaxRecords
	}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("creating history directory: %w", err)
		}
	}
	return &Store{
		dir:    dir,
		max:    maxRecords,
		counts: map[string]int{},
		memory: map[string][]Record{},
		subs:   map[string]map[chan Record]struct{}{},
	}, nil
}

func checkKey(key string) error {
	if !validKey.MatchString(key) || key == "." || key == ".." {
		return fmt.Errorf("%w: %q", ErrInvalidKey, key)
	}
	return nil
}

func (s *Store) file(key string) string { return filepath.Join(s.dir, key+".jsonl") }

// Append adds a record and wakes every follower of key. The oldest records
// beyond the store's maximum are dropped.
func (s *Store) Append(key string, r Record) error {
	if err := checkKey(key); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dir == "" {
		recs := append(s.memory[key], r)
		if len(recs) > s.max {
			recs = append([]Record(nil), recs[len(recs)-s.max:]...)
		}
		s.memory[key] = recs
	} else if err := s.appendFile(key, r); err != nil {
		return err
	}
	for ch := range s.subs[key] {
		select {
		case ch <- r:
		default:
			// A follower that does not keep up is dropped rather than
			// allowed to block every exec on this sandbox.
			close(ch)
			delete(s.subs[key], ch)
		}
	}
	return nil
}

func (s *Store) appendFile(key string, r Record) error {
	line, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encoding history record: %w", err)
	}
	path := s.file(key)
	count, known := s.counts[key]
	if !known {
		recs, err := readFile(path)
		if err != nil {
			return err
		}
		count = len(recs)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("opening history file: %w", err)
	}
	_, werr := f.Write(append(line, '\n'))
	cerr := f.Close()
	if werr != nil || cerr != nil {
		return fmt.Errorf("writing history file %s: %w", path, errors.Join(werr, cerr))
	}
	count++
	// Compact only when twice over the limit, so appends stay O(1) on
	// average.
	if count > 2*s.max {
		recs, err := readFile(path)
		if err != nil {
			return err
		}
		recs = recs[len(recs)-s.max:]
		if err := writeFile(path, recs); err != nil {
			return err
		}
		count = len(recs)
	}
	s.counts[key] = count
	return nil
}

func readFile(path string) ([]Record, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading history file: %w", err)
	}
	var recs []Record
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var r Record
		// A torn last line (a crash mid-write) is skipped, not fatal.
		if err := json.Unmarshal(sc.Bytes(), &r); err == nil {
			recs = append(recs, r)
		}
	}
	return recs, nil
}

func writeFile(path string, recs []Record) error {
	var buf bytes.Buffer
	for _, r := range recs {
		line, err := json.Marshal(r)
		if err != nil {
			return err
		}
		buf.Write(line)
		buf.WriteByte('\n')
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o600); err != nil {
		return fmt.Errorf("compacting history file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("compacting history file: %w", err)
	}
	return nil
}

// Tail returns the last n records of key, oldest first; n ≤ 0 means all.
func (s *Store) Tail(key string, n int) ([]Record, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tailLocked(key, n)
}

func (s *Store) tailLocked(key string, n int) ([]Record, error) {
	var recs []Record
	if s.dir == "" {
		recs = append([]Record(nil), s.memory[key]...)
	} else {
		var err error
		if recs, err = readFile(s.file(key)); err != nil {
			return nil, err
		}
		s.counts[key] = len(recs)
	}
	if len(recs) > s.max {
		recs = recs[len(recs)-s.max:]
	}
	if n > 0 && len(recs) > n {
		recs = recs[len(recs)-n:]
	}
	return recs, nil
}

// Follow calls fn with the last tail records of key (all when tail ≤ 0),
// then with each new record as it is appended, until ctx ends or fn returns
// an error. It returns nil when ctx ends.
func (s *Store) Follow(ctx context.Context, key string, tail int, fn func(Record) error) error {
	if err := checkKey(key); err != nil {
		return err
	}
	ch := make(chan Record, 256)
	s.mu.Lock()
	// Subscribing under the same lock as the snapshot means no record is
	// missed or repeated between the two.
	recs, err := s.tailLocked(key, tail)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	if s.subs[key] == nil {
		s.subs[key] = map[chan Record]struct{}{}
	}
	s.subs[key][ch] = struct{}{}
	s.mu.Unlock()
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
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.subs[key][ch]; ok {
		delete(s.subs[key], ch)
	}
	if len(s.subs[key]) == 0 {
		delete(s.subs, key)
	}
}

// Delete forgets key's records (when its sandbox is gone).
func (s *Store) Delete(key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.memory, key)
	delete(s.counts, key)
	if s.dir != "" {
		if err := os.Remove(s.file(key)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing history file: %w", err)
		}
	}
	return nil
}
