package contract

import (
	"context"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// ProcessCall is one call on a sandbox's background processes (issue 26):
// an execio.ProcessRequest with its command decoded and its wait as a
// duration.
type ProcessCall struct {
	// Action is one of execio.ProcessAction*.
	Action string
	// Handle names the process (not for start and list). Handles are
	// minted by the sandbox's backend and mean something only in their
	// sandbox.
	Handle string
	// Command is what start runs (normalized by the backend); its own
	// timeout is ignored.
	Command execio.Request
	// CommandTimeout kills a started process's tree after that long (0:
	// never).
	CommandTimeout time.Duration
	// StdoutOffset and StderrOffset are where poll and wait read from.
	StdoutOffset, StderrOffset int64
	// Timeout bounds wait (at most execio.MaxProcessWait).
	Timeout time.Duration
	// Stdin is written by stdin, and CloseStdin closes it after.
	Stdin      []byte
	CloseStdin bool
}

// ProcessBackend is a Backend whose sandboxes run background processes.
// The processes and their output live in the sandbox, so any server
// replica answers for any handle, and a restarted one finds them again.
// Errors wrap execio.ErrProcessNotFound, ErrTooManyProcesses and
// ErrProcessExited, besides the Backend's.
type ProcessBackend interface {
	Processes(ctx context.Context, caller Caller, id string, call ProcessCall) (execio.ProcessResponse, error)
}
