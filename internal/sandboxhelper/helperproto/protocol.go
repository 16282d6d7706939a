// Package helperproto is the wire protocol between the manager (or the MCP
// server) and code-sandbox-helper, the static binary that runs inside every
// sandbox (internal/sandboxhelper): the error line the helper writes on
// stderr, its exit codes, the environment marker of a run, and the frames
// of the resident helper (serve.go).
//
// It is a leaf: it imports nothing from this module but execio, whose
// sentinel errors the helper's errors unwrap to, so the manager and the MCP
// server can speak the protocol without linking the helper itself.
package helperproto

import (
	"bytes"
	"encoding/json"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// Error kinds, as they appear in the error line.
const (
	KindNotFound         = "not_found"
	KindInvalidPath      = "invalid_path"
	KindTooLarge         = "too_large"
	KindUnsupportedEntry = "unsupported_entry"
	KindOther            = "other"
	// KindPortClosed: `dial` found nothing listening on the port.
	KindPortClosed = "port_closed"
)

// Exit codes of the helper's own failures. `run` otherwise exits with its
// command's code (128+N when a signal ended it, 137 when the helper killed
// the tree, 126/127 when the command could not be executed).
const (
	ExitUsage            = 2
	ExitOther            = 10
	ExitNotFound         = 11
	ExitInvalidPath      = 12
	ExitTooLarge         = 13
	ExitUnsupportedEntry = 14
	ExitPortClosed       = 15
	// ExitKilled is what `run` exits with after killing the tree.
	ExitKilled = 137
	// ExitCannotExecute and ExitCommandNotFound mirror the shell's.
	ExitCannotExecute   = 126
	ExitCommandNotFound = 127
)

// RunIDEnv is set to the run's ID in the environment of every command `run`
// starts, so the tree can be found even where processes escape the parent
// chain (no subreaper, as under some gVisor releases).
const RunIDEnv = "CODE_SANDBOX_RUN_ID"

// DialConnected is what `dial` writes on stderr once its connection to the
// sandbox's port is up; bytes relayed follow on stdout.
const DialConnected = "code-sandbox-helper: connected\n"

// ErrorPrefix starts the helper's error line on stderr; a JSON Error follows.
const ErrorPrefix = "code-sandbox-helper: error: "

// Error is the helper's machine-readable failure report.
type Error struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message }

// Unwrap maps the kind back to execio's sentinel errors, so errors.Is works
// on both sides of the exec.
func (e *Error) Unwrap() error {
	switch e.Kind {
	case KindNotFound:
		return execio.ErrPathNotFound
	case KindInvalidPath:
		return execio.ErrInvalidPath
	case KindTooLarge:
		return execio.ErrTooLarge
	case KindUnsupportedEntry:
		return execio.ErrUnsupportedEntry
	case KindNoSuchProcess:
		return execio.ErrProcessNotFound
	case KindTooManyProcesses:
		return execio.ErrTooManyProcesses
	case KindProcessExited:
		return execio.ErrProcessExited
	}
	return nil
}

// ExitCode is the helper's exit code for the kind.
func (e *Error) ExitCode() int {
	switch e.Kind {
	case KindNotFound:
		return ExitNotFound
	case KindInvalidPath:
		return ExitInvalidPath
	case KindTooLarge:
		return ExitTooLarge
	case KindUnsupportedEntry:
		return ExitUnsupportedEntry
	case KindPortClosed:
		return ExitPortClosed
	}
	return ExitOther
}

// ParseError finds the helper's error line in what an exec wrote to stderr
// (the last one wins) and decodes it.
func ParseError(stderr []byte) (*Error, bool) {
	i := bytes.LastIndex(stderr, []byte(ErrorPrefix))
	if i < 0 {
		return nil, false
	}
	line := stderr[i+len(ErrorPrefix):]
	if j := bytes.IndexByte(line, '\n'); j >= 0 {
		line = line[:j]
	}
	var e Error
	if err := json.Unmarshal(line, &e); err != nil || e.Kind == "" {
		return nil, false
	}
	return &e, true
}
