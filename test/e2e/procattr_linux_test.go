//go:build e2e && linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import "syscall"

// managerProcAttr keeps the manager out of the terminal's process group, so
// that Ctrl-C reaches only the test, which then stops the manager after the
// specs' own cleanup (deleting a Sandbox needs a live manager to release its
// finalizer). Pdeathsig kills the manager if the test binary itself is killed
// and cannot clean up; the next run removes the containers it left.
func managerProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
