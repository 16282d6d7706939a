package dockerruntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

// File transfers run the helper's own `untar` and `tar` (the one walker,
// with its limits and path rules) as a command of the sandbox's resident
// helper, instead of a Docker exec each: a 1 KiB write_file cost ~50 ms,
// nearly all of it the exec's process setup, and costs what a repeated
// command does this way. An upload goes as the command's stdin, so only an
// archive of at most serveUploadMax (sanitised) takes this path; a larger
// one streams through an exec of its own as before. A download streams
// back as the command's stdout frames, recounted and bounded on this side
// by execio.ForwardTar as before.

// serveUploadMax bounds an upload carried in the resident helper's request
// frame (helperproto.MaxRequestFrame, base64 in JSON); it is held in memory
// while it is sent.
const serveUploadMax = 4 << 20

// transferTimeout is a transfer's command timeout in the helper: none of
// its own, as with an exec; the caller's context bounds it.
const transferTimeout = execio.MaxTimeout

// runInHelper runs argv, one of the helper's own subcommands, as a command
// of the sandbox's resident helper: stdin fed, stdout and stderr streamed
// to w and stderr. handled is false, with nothing run, when the sandbox's
// helper predates serve; the caller then uses an exec.
func (c *Client) runInHelper(ctx context.Context, id string, argv []string, stdin []byte, stdout, stderr io.Writer) (code int, handled bool, err error) {
	if c.isLegacy(id) {
		return 0, false, nil
	}
	runID := newRunID()
	request, err := json.Marshal(helperproto.ServeRequest{ID: runID, Argv: argv, Stdin: stdin})
	if err != nil {
		return 0, true, fmt.Errorf("encoding the transfer for the sandbox helper: %w", err)
	}
	s, err := c.acceptedServe(ctx, id, request, c.callTimeout+helperBackstopGrace)
	if errors.Is(err, errHelperWithoutServe) {
		c.markLegacy(id)
		return 0, false, nil
	}
	if err != nil {
		return 0, true, err
	}
	res, reusable, err := c.streamServe(ctx, s, execio.Request{
		TimeoutSeconds:   int64(transferTimeout / time.Second),
		OutputLimitBytes: math.MaxInt64, // bounded by the caller's writer
	}, stdout, stderr, runID)
	if reusable {
		c.park(id, s)
	} else {
		s.close()
	}
	return res.ExitCode, true, err
}

// untarArgv and tarArgv are the helper's transfer commands.
func untarArgv(dest execio.Target, limits execio.UploadLimits) []string {
	argv := []string{HelperPath, "untar", "--root=" + dest.Root, "--dest=" + dest.Rel,
		fmt.Sprintf("--max-bytes=%d", limits.MaxBytes), fmt.Sprintf("--max-entries=%d", limits.MaxEntries)}
	if limits.Symlinks {
		argv = append(argv, "--links=1")
	}
	return argv
}

func tarArgv(src execio.Target, maxBytes int64) []string {
	return []string{HelperPath, "tar", "--root=" + src.Root, "--path=" + src.Rel, fmt.Sprintf("--max-bytes=%d", maxBytes)}
}

// failingReader returns err (io.EOF when nil) on every read: the end of a
// replayed upload whose sanitiser failed, so the exec's helper sees the
// archive cut where the sanitiser stopped, as it would have streamed.
type failingReader struct{ err error }

func (f failingReader) Read([]byte) (int, error) {
	if f.err == nil {
		return 0, io.EOF
	}
	return 0, f.err
}
