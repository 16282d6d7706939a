// Package sandboxhelper is the logic of code-sandbox-helper, the static
// binary the manager delivers into every sandbox (read-only, through the
// tools volume) and runs there with `docker exec`, as the sandbox's user.
//
// It exists because Docker cannot do two things a sandbox needs: kill an exec
// (there is no exec kill, moby#9098), and copy files into a read-only-rootfs
// container or its tmpfs mounts (the archive API writes the container's
// layer). So every command runs under `helper run`, which owns the command's
// whole process tree and can kill it (forked by the sandbox's resident
// `helper serve`, which takes commands as frames on its stdin, so that a
// command costs no Docker exec), and every file transfer is a tar
// streamed through `helper untar` / `helper tar`, which open paths with
// os.Root so that no symlink the sandbox plants leads out of the allowed
// directory.
//
// Failures are reported as one machine-readable line on stderr and a
// distinct exit code, so the manager maps them back to execio's errors. That
// protocol lives in the leaf package helperproto, which the manager and the
// MCP server import instead of this one.
package sandboxhelper

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

// classify turns any error into an Error, keeping its text.
func classify(err error) *helperproto.Error {
	var he *helperproto.Error
	if errors.As(err, &he) {
		return he
	}
	kind := helperproto.KindOther
	switch {
	case errors.Is(err, execio.ErrPathNotFound), errors.Is(err, os.ErrNotExist):
		kind = helperproto.KindNotFound
	case errors.Is(err, execio.ErrInvalidPath), strings.Contains(err.Error(), "path escapes from parent"):
		// os.Root reports an escape with an unexported error; its text is
		// the only handle.
		kind = helperproto.KindInvalidPath
	case errors.Is(err, execio.ErrTooLarge):
		kind = helperproto.KindTooLarge
	case errors.Is(err, execio.ErrUnsupportedEntry):
		kind = helperproto.KindUnsupportedEntry
	}
	return &helperproto.Error{Kind: kind, Message: err.Error()}
}

// report writes the error line and returns the exit code for it.
func report(stderr io.Writer, err error) int {
	he := classify(err)
	line, _ := json.Marshal(he)
	_, _ = fmt.Fprintf(stderr, "%s%s\n", helperproto.ErrorPrefix, line)
	return he.ExitCode()
}
