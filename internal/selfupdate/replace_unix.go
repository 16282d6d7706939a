//go:build !windows

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package selfupdate

import (
	"os"
	"path/filepath"
)

// swap keeps a copy of exe at old and renames incoming over exe: a
// running process keeps its (unlinked) file, and exe is never missing.
func swap(exe, incoming, old string) error {
	if _, err := os.Stat(exe); err == nil {
		tmp, err := copyToTemp(exe, filepath.Dir(exe))
		if err != nil {
			return err
		}
		if err := os.Rename(tmp, old); err != nil {
			os.Remove(tmp)
			return err
		}
	}
	return os.Rename(incoming, exe)
}
