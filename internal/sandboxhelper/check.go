/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxhelper

import (
	"fmt"
	"os"
)

// check is the health check of a warm pool member before it is frozen. It
// runs as a command (serve, then run), the path every exec of a claimant
// takes, so passing it says that the sandbox user can run a command in the
// working directory; and it writes and removes a file there and in /tmp,
// where a claimant's files go. It depends on nothing in the image, and
// leaves no file and no process behind.
func check() error {
	wd, err := os.Getwd()
	if err != nil {
		return fmt.Errorf("the working directory is not accessible: %w", err)
	}
	for _, dir := range []string{wd, "/tmp"} {
		f, err := os.CreateTemp(dir, ".code-sandbox-check-*")
		if err != nil {
			return fmt.Errorf("cannot write in %s: %w", dir, err)
		}
		name := f.Name()
		err = f.Close()
		if rmErr := os.Remove(name); err == nil {
			err = rmErr
		}
		if err != nil {
			return fmt.Errorf("writing a probe file in %s: %w", dir, err)
		}
	}
	return nil
}
