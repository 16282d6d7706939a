// Package sandboxhelper is the logic of code-sandbox-helper, the static
// binary the manager delivers into every sandbox (read-only, through the
// tools volume) and runs there with `docker exec`, as the sandbox's user.
//
// It exists because Docker cannot do two things a sandbox needs: kill an exec
// (there is no exec kill, moby#9098), and copy files into a read-only-rootfs
// container or its tmpfs mounts (the archive API writes the container's
// layer). So every command runs under `helper run`, which owns the command's
// whole process tree and can kill it, and every file transfer is a tar
// streamed through `helper untar` / `helper tar`, which open paths with
// os.Root so that no symlink the sandbox plants leads out of the allowed
// directory.
//
// Failures are reported as one machine-readable line on stderr (see Error)
// and a distinct exit code, so the manager maps them back to execio's errors.
package sandboxhelper

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// Error kinds, as they appear in the error line.
const (
	KindNotFound         = "not_found"
	KindInvalidPath      = "invalid_path"
	KindTooLarge         = "too_large"
	KindUnsupportedEntry = "unsupported_entry"
	KindOther            = "other"
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
	}
	return ExitOther
}

// classify turns any error into an Error, keeping its text.
func classify(err error) *Error {
	var he *Error
	if errors.As(err, &he) {
		return he
	}
	kind := KindOther
	switch {
	case errors.Is(err, execio.ErrPathNotFound), errors.Is(err, os.ErrNotExist):
		kind = KindNotFound
	case errors.Is(err, execio.ErrInvalidPath), strings.Contains(err.Error(), "path escapes from parent"):
		// os.Root reports an escape with an unexported error; its text is
		// the only handle.
		kind = KindInvalidPath
	case errors.Is(err, execio.ErrTooLarge):
		kind = KindTooLarge
	case errors.Is(err, execio.ErrUnsupportedEntry):
		kind = KindUnsupportedEntry
	}
	return &Error{Kind: kind, Message: err.Error()}
}

// report writes the error line and returns the exit code for it.
func report(stderr io.Writer, err error) int {
	he := classify(err)
	line, _ := json.Marshal(he)
	_, _ = fmt.Fprintf(stderr, "%s%s\n", ErrorPrefix, line)
	return he.ExitCode()
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
