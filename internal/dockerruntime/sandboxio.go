package dockerruntime

import (
	"context"
	"errors"
	"io"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
)

// RunCommand runs req in the running sandbox container id, as the sandbox's
// user, through the in-sandbox helper. stdout and stderr receive the output
// as it arrives, each capped at req.OutputLimitBytes with a truncation
// marker. When the timeout fires, or ctx ends, the command's whole process
// tree is killed; a timeout is reported in the Result, a cancellation as
// ctx's error.
func (c *Client) RunCommand(ctx context.Context, id string, req execio.Request, stdout, stderr io.Writer) (execio.Result, error) {
	return execio.Result{}, errors.New("RunCommand: not implemented yet")
}

// CopyIn extracts a tar stream into dest inside the sandbox. Only regular
// files and directories are accepted; the helper opens every path beneath
// dest.Root and never follows a symlink out of it.
func (c *Client) CopyIn(ctx context.Context, id string, dest execio.Target, archive io.Reader, limits execio.UploadLimits) (execio.TransferStats, error) {
	return execio.TransferStats{}, errors.New("CopyIn: not implemented yet")
}

// CopyOut writes a tar of src (a file or a tree) to w, stopping with
// execio.ErrTooLarge once maxBytes of file content have been sent.
func (c *Client) CopyOut(ctx context.Context, id string, src execio.Target, w io.Writer, maxBytes int64) (execio.TransferStats, error) {
	return execio.TransferStats{}, errors.New("CopyOut: not implemented yet")
}
