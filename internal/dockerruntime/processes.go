package dockerruntime

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

// Background processes (issue 26): commands that run detached from every
// exec stream, under a supervisor of the in-sandbox helper (`helper proc`,
// see helperproto/proc.go). Everything about them lives in the sandbox: the
// output rings on its /tmp tmpfs count against its disk and memory, and a
// new Client (a restarted manager) finds them again, since each call is one
// short `helper proc` command through the resident helper.

const (
	// procCallTimeout bounds a proc call other than wait.
	procCallTimeout = 30 * time.Second
	// procOutputMax bounds what the manager reads of a proc call's stdout:
	// two rings base64-encoded in JSON, the command line, and headroom. The
	// sandbox can forge the output, so it is bounded here, not trusted.
	procOutputMax = 4 * (helperproto.RingBytes*2 + execio.MaxArgBytes)
)

// NewProcessHandle mints a handle: opaque, random, and meaningful in one
// sandbox only (each sandbox has its own processes).
func NewProcessHandle() string { return "p-" + randid.Hex(12) }

// ProcessOffsets are where a poll starts reading each stream.
type ProcessOffsets struct {
	Stdout, Stderr int64
}

// StartProcess starts req detached in the sandbox under handle and returns
// its status. req's stdin must be empty (write it with WriteProcessStdin),
// and its own timeout is ignored: the process runs until it exits, is
// killed, the sandbox ends, or timeout passes (0: never), when the helper
// kills its tree (exit 137).
func (c *Client) StartProcess(ctx context.Context, id, handle string, req execio.Request, timeout time.Duration) (execio.ProcessStatus, error) {
	req, err := req.Normalize()
	if err != nil {
		return execio.ProcessStatus{}, err
	}
	if len(req.Stdin) > 0 {
		return execio.ProcessStatus{}, fmt.Errorf("%w: a background command takes no stdin in its request; write it to the process's stdin once started", execio.ErrInvalidRequest)
	}
	if timeout < 0 || timeout > execio.MaxTimeout {
		return execio.ProcessStatus{}, fmt.Errorf("%w: a background process's timeout is between 0 (none) and %s, got %s", execio.ErrInvalidRequest, execio.MaxTimeout, timeout)
	}
	backstop := int64((timeout + time.Second - 1) / time.Second)
	args := append([]string{"start", "--id=" + handle, "--backstop=" + strconv.FormatInt(backstop, 10), "--"}, req.Argv()...)
	var st execio.ProcessStatus
	err = c.procCall(ctx, id, execio.Request{Env: req.Env, WorkingDir: req.WorkingDir}, procCallTimeout, nil, &st, args...)
	return st, err
}

// ListProcesses reports the sandbox's background processes, oldest first.
func (c *Client) ListProcesses(ctx context.Context, id string) ([]execio.ProcessStatus, error) {
	var out []execio.ProcessStatus
	if err := c.procCall(ctx, id, execio.Request{}, procCallTimeout, nil, &out, "list"); err != nil {
		return nil, err
	}
	for _, st := range out {
		if !ValidProcessHandle(st.Handle) {
			return nil, fmt.Errorf("the sandbox helper listed a process with the invalid handle %q", st.Handle)
		}
	}
	return out, nil
}

// PollProcess reports the process's status and its output since off.
func (c *Client) PollProcess(ctx context.Context, id, handle string, off ProcessOffsets) (execio.ProcessOutput, error) {
	return c.WaitProcess(ctx, id, handle, off, 0)
}

// WaitProcess is PollProcess once the process has exited or timeout has
// passed (at most helperproto.MaxProcWait), whichever comes first.
func (c *Client) WaitProcess(ctx context.Context, id, handle string, off ProcessOffsets, timeout time.Duration) (execio.ProcessOutput, error) {
	var out execio.ProcessOutput
	if timeout < 0 || timeout > helperproto.MaxProcWait {
		return out, fmt.Errorf("%w: a wait is bounded to %s, got %s", execio.ErrInvalidRequest, helperproto.MaxProcWait, timeout)
	}
	if off.Stdout < 0 || off.Stderr < 0 {
		return out, fmt.Errorf("%w: negative output offset", execio.ErrInvalidRequest)
	}
	err := c.procCall(ctx, id, execio.Request{}, procCallTimeout+timeout, nil, &out, "wait", "--id="+handle,
		"--timeout-ms="+strconv.FormatInt(timeout.Milliseconds(), 10),
		"--stdout-offset="+strconv.FormatInt(off.Stdout, 10), "--stderr-offset="+strconv.FormatInt(off.Stderr, 10))
	return out, err
}

// KillProcess kills the process's whole tree and reports its status (that
// of a process that had already ended, unchanged).
func (c *Client) KillProcess(ctx context.Context, id, handle string) (execio.ProcessStatus, error) {
	var st execio.ProcessStatus
	err := c.procCall(ctx, id, execio.Request{}, procCallTimeout, nil, &st, "kill", "--id="+handle)
	return st, err
}

// WriteProcessStdin writes data (at most helperproto.MaxStdinWrite) to the
// process's stdin, then closes it when eof is set. It blocks while the
// process does not read, up to ctx.
func (c *Client) WriteProcessStdin(ctx context.Context, id, handle string, data []byte, eof bool) (execio.ProcessStatus, error) {
	var st execio.ProcessStatus
	if len(data) > helperproto.MaxStdinWrite {
		return st, fmt.Errorf("%w: a write to stdin is at most %d bytes, got %d", execio.ErrTooLarge, helperproto.MaxStdinWrite, len(data))
	}
	args := []string{"stdin", "--id=" + handle}
	if eof {
		args = append(args, "--eof")
	}
	err := c.procCall(ctx, id, execio.Request{}, procCallTimeout, data, &st, args...)
	return st, err
}

// ValidProcessHandle is the helper's rule for handles; the manager applies
// it before anything reaches the sandbox, and to what the sandbox reports.
func ValidProcessHandle(h string) bool {
	if h == "" || len(h)+len(helperproto.ProcRunIDPrefix) > 64 {
		return false
	}
	for _, c := range h {
		if !(c == '-' || c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// procCall runs `helper proc ARGS` in the sandbox and decodes its JSON.
func (c *Client) procCall(ctx context.Context, id string, base execio.Request, timeout time.Duration, stdin []byte, out any, args ...string) error {
	if len(args) > 1 && len(args[1]) > 5 && args[1][:5] == "--id=" && !ValidProcessHandle(args[1][5:]) {
		return fmt.Errorf("%w: %q is not a process handle", execio.ErrProcessNotFound, args[1][5:])
	}
	base.Command = append([]string{HelperPath, "proc"}, args...)
	base.Stdin = stdin
	base.TimeoutSeconds = int64((timeout + time.Second - 1) / time.Second)
	base.OutputLimitBytes = procOutputMax
	var stdout bytes.Buffer
	stderr := &boundedBuffer{max: helperStderrMax}
	res, err := c.RunCommand(ctx, id, base, &stdout, stderr)
	if err != nil {
		return err
	}
	what := "background process call " + args[0]
	switch {
	case res.TimedOut:
		return fmt.Errorf("%s: the sandbox helper did not answer within %s", what, timeout)
	case res.ExitCode != 0:
		return helperFailure(what, res.ExitCode, stderr.buf.Bytes())
	case res.StdoutTruncated:
		return fmt.Errorf("%s: the sandbox helper's answer is over %d bytes", what, procOutputMax)
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		return fmt.Errorf("%s: decoding the sandbox helper's answer: %w", what, err)
	}
	return nil
}
