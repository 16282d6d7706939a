package mcpmain

import (
	"fmt"
	"os"
	"syscall"
)

// claimStdout takes file descriptor 1 for the JSON-RPC stream and points fd
// 1 (and os.Stdout) at stderr, so that nothing else in the process, not
// even a stray print in a dependency, can corrupt the protocol.
func claimStdout() (*os.File, error) {
	fd, err := syscall.Dup(1)
	if err != nil {
		return nil, fmt.Errorf("duplicating stdout: %w", err)
	}
	syscall.CloseOnExec(fd)
	if err := syscall.Dup3(2, 1, 0); err != nil {
		return nil, fmt.Errorf("redirecting stdout to stderr: %w", err)
	}
	os.Stdout = os.Stderr
	return os.NewFile(uintptr(fd), "mcp-stdout"), nil
}
