package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// openLocalDest opens the directory that a download to the local path dst
// is written through, and returns dst relative to it. The user named dst on
// the command line, so symlinks on the way to it are theirs and are
// resolved here; from there on, internal/hostfs works through the returned
// os.Root and never follows a symlink out of it. destIsDir tells that dst
// was written with a trailing separator (a directory to put things into).
func openLocalDest(dst string) (root *os.Root, rel string, destIsDir bool, err error) {
	if dst == "" {
		return nil, "", false, errors.New("the local destination is empty")
	}
	destIsDir = strings.HasSuffix(dst, "/") || strings.HasSuffix(dst, string(filepath.Separator))
	abs, err := filepath.Abs(dst)
	if err != nil {
		return nil, "", false, fmt.Errorf("cannot copy to %s: %w", dst, err)
	}
	// The longest existing ancestor is resolved; the missing rest is
	// created by the download (and removed again if it fails).
	existing, rest := abs, ""
	for {
		_, err := os.Lstat(existing)
		if err == nil {
			break
		}
		parent := filepath.Dir(existing)
		if !errors.Is(err, fs.ErrNotExist) || parent == existing {
			return nil, "", false, fmt.Errorf("cannot copy to %s: %w", dst, err)
		}
		rest = filepath.Join(filepath.Base(existing), rest)
		existing = parent
	}
	real, err := filepath.EvalSymlinks(existing)
	if err != nil {
		return nil, "", false, fmt.Errorf("cannot copy to %s: %w", dst, err)
	}
	dir, rel := real, rest
	if rest == "" {
		dir, rel = filepath.Dir(real), filepath.Base(real)
		if dir == real { // the filesystem root
			rel = "."
		}
	}
	root, err = os.OpenRoot(dir)
	if err != nil {
		return nil, "", false, fmt.Errorf("cannot copy to %s: %w", dst, err)
	}
	return root, filepath.ToSlash(rel), destIsDir, nil
}
