/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

// maxProcessResponse bounds what is read of a processes answer: two rings
// base64-encoded in JSON, a command line and headroom.
const maxProcessResponse = 4*(2*execio.ProcessRingBytes+execio.MaxArgBytes) + 1<<20

// StartProcess starts req in the Sandbox as a background process and
// returns at once with its status; its Handle names it in later calls.
// req's stdin must be empty (write it with WriteProcessStdin), and its own
// timeout is ignored: the process runs until it exits, is killed, the
// Sandbox ends, or timeout (0: none) passes.
func (c *Client) StartProcess(ctx context.Context, ref Ref, req execio.Request, timeout time.Duration) (execio.ProcessStatus, error) {
	raw, err := json.Marshal(req)
	if err != nil {
		return execio.ProcessStatus{}, fmt.Errorf("encoding the command: %w", err)
	}
	resp, err := c.processes(ctx, ref, execio.ProcessRequest{Action: execio.ProcessActionStart, Command: raw,
		TimeoutSeconds: int64((timeout + time.Second - 1) / time.Second)})
	return statusOf(resp), err
}

// ListProcesses lists the Sandbox's background processes, oldest first.
func (c *Client) ListProcesses(ctx context.Context, ref Ref) ([]execio.ProcessStatus, error) {
	resp, err := c.processes(ctx, ref, execio.ProcessRequest{Action: execio.ProcessActionList})
	return resp.Processes, err
}

// PollProcess reports the process's status and its output from the
// offsets (the Next of the previous answer's streams; 0 for all that is
// kept).
func (c *Client) PollProcess(ctx context.Context, ref Ref, handle string, stdoutOffset, stderrOffset int64) (execio.ProcessOutput, error) {
	resp, err := c.processes(ctx, ref, execio.ProcessRequest{Action: execio.ProcessActionPoll, Handle: handle,
		StdoutOffset: stdoutOffset, StderrOffset: stderrOffset})
	return outputOf(resp), err
}

// WaitProcess is PollProcess once the process has exited or timeout
// (at most execio.MaxProcessWait) has passed, whichever is first.
func (c *Client) WaitProcess(ctx context.Context, ref Ref, handle string, stdoutOffset, stderrOffset int64, timeout time.Duration) (execio.ProcessOutput, error) {
	resp, err := c.processes(ctx, ref, execio.ProcessRequest{Action: execio.ProcessActionWait, Handle: handle,
		StdoutOffset: stdoutOffset, StderrOffset: stderrOffset, TimeoutMillis: timeout.Milliseconds()})
	return outputOf(resp), err
}

// KillProcess kills the process's whole tree and reports its status.
func (c *Client) KillProcess(ctx context.Context, ref Ref, handle string) (execio.ProcessStatus, error) {
	resp, err := c.processes(ctx, ref, execio.ProcessRequest{Action: execio.ProcessActionKill, Handle: handle})
	return statusOf(resp), err
}

// WriteProcessStdin writes data (at most execio.MaxProcessStdinWrite) to
// the process's stdin and closes it after when closeStdin is set.
func (c *Client) WriteProcessStdin(ctx context.Context, ref Ref, handle string, data []byte, closeStdin bool) (execio.ProcessStatus, error) {
	resp, err := c.processes(ctx, ref, execio.ProcessRequest{Action: execio.ProcessActionStdin, Handle: handle, Stdin: data, CloseStdin: closeStdin})
	return statusOf(resp), err
}

// IsProcessNotFound: no background process has the handle in the Sandbox.
func IsProcessNotFound(err error) bool { return HasCause(err, subresource.CauseProcessNotFound) }

// IsProcessLimit: the Sandbox already runs its limit of background
// processes.
func IsProcessLimit(err error) bool { return HasCause(err, subresource.CauseProcessLimit) }

// IsProcessExited: the process has exited or closed its stdin.
func IsProcessExited(err error) bool { return HasCause(err, subresource.CauseProcessExited) }

func statusOf(r execio.ProcessResponse) execio.ProcessStatus {
	if r.Process == nil {
		return execio.ProcessStatus{}
	}
	return *r.Process
}

func outputOf(r execio.ProcessResponse) execio.ProcessOutput {
	if r.Output == nil {
		return execio.ProcessOutput{}
	}
	return *r.Output
}

func (c *Client) processes(ctx context.Context, ref Ref, preq execio.ProcessRequest) (execio.ProcessResponse, error) {
	ns, name := ref.key()
	var out execio.ProcessResponse
	body, err := json.Marshal(preq)
	if err != nil {
		return out, fmt.Errorf("sandbox %s/%s: encoding the processes request: %w", ns, name, err)
	}
	resp, err := c.do(ctx, ref, request{
		method:      http.MethodPost,
		subresource: subresource.SubresourceProcesses,
		body:        bytes.NewReader(body),
		length:      int64(len(body)),
		contentType: "application/json",
		accept:      "application/json",
	})
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxProcessResponse+1))
	if err != nil {
		return out, fmt.Errorf("sandbox %s/%s: reading the processes answer: %w", ns, name, err)
	}
	if len(data) > maxProcessResponse {
		return out, fmt.Errorf("sandbox %s/%s: the processes answer is over %d bytes", ns, name, maxProcessResponse)
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return out, fmt.Errorf("sandbox %s/%s: decoding the processes answer: %w", ns, name, err)
	}
	return out, nil
}
