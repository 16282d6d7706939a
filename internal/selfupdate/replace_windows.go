//go:build windows

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package selfupdate

import "os"

// swap moves exe aside to old (Windows lets a running executable be
// renamed but not replaced or deleted) and renames incoming to exe, moving
// exe back when that fails.
func swap(exe, incoming, old string) error {
	if _, err := os.Stat(old); err == nil {
		// A previous .old may still be running (it was the binary before
		// the last update); Windows refuses to replace it then.
		if err := os.Remove(old); err != nil {
			return err
		}
	}
	if err := os.Rename(exe, old); err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := os.Rename(incoming, exe); err != nil {
		_ = os.Rename(old, exe)
		return err
	}
	return nil
}
