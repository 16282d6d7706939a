/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxhelper

import "syscall"

// hideFromSandbox makes this process non-dumpable. The helper runs as the
// sandbox's own user, so without this, sandbox code could open
// /proc/<helper>/fd/0 and /proc/<helper>/environ (ptrace access rules for
// the same uid) and read or forge the frames of a resident helper: a later
// command's env and stdin, or its exit status. A non-dumpable process's
// /proc entries belong to root and ptrace access to it needs
// CAP_SYS_PTRACE, which a sandbox never has. execve resets the flag, so the
// commands the helper starts are unaffected.
// The helper links only the standard library (depguard), hence the raw
// prctl(2).
func hideFromSandbox() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0); errno != 0 {
		return errno
	}
	return nil
}
