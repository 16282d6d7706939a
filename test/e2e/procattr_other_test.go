//go:build e2e && !linux

/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package e2e

import "syscall"

// managerProcAttr: see procattr_linux_test.go. Without Pdeathsig a killed
// test binary can leave the manager running; only its process group is set.
func managerProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
