package dockerruntime

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"
)

// ExecOptions describe one command run in a sandbox.
type ExecOptions struct {
	Cmd        []string
	WorkingDir string
	Env        []string
	Stdin      io.Reader
	// openStdin attaches stdin for the caller to write to the attachment
	// (a serve helper's requests), instead of copying Stdin.
	openStdin bool
}

// ExecResult is how a command ended.
type ExecResult struct {
	ExitCode int
	Duration time.Duration
}

// Exec runs a command in a running sandbox as the sandbox's user and streams
// its output to stdout and stderr as it arrives. The command is passed as
// argv; nothing is interpreted by a shell on the host. Unlike RunCommand it
// has no timeout of its own and cannot kill what it started: ending ctx only
// stops waiting.
func (c *Client) Exec(ctx context.Context, id string, opts ExecOptions, stdout, stderr io.Writer) (ExecResult, error) {
	start := time.Now()
	execID, attach, err := c.startExec(ctx, id, opts)
	if err != nil {
		return ExecResult{}, err
	}
	defer attach.Close()
	copyDone := make(chan error, 1)
	go func() { copyDone <- copyExecOutput(attach.Reader, stdout, stderr) }()
	select {
	case <-ctx.Done():
		attach.Close()
		// The caller's deadline or cancellation, not a Docker failure.
		return ExecResult{Duration: time.Since(start)}, fmt.Errorf("running exec in %s: %w", ShortID(id), ctx.Err())
	case err := <-copyDone:
		if err != nil {
			return ExecResult{Duration: time.Since(start)}, classify(err, "reading exec output")
		}
	}
	code, err := c.execExitCode(ctx, execID)
	return ExecResult{ExitCode: code, Duration: time.Since(start)}, err
}

// startExec creates and attaches an exec, and starts feeding opts.Stdin (then
// closing the exec's stdin) in the background.
func (c *Client) startExec(ctx context.Context, id string, opts ExecOptions) (string, types.HijackedResponse, error) {
	if len(opts.Cmd) == 0 {
		return "", types.HijackedResponse{}, fmt.Errorf("%w: exec needs a command", ErrInvalidSpec)
	}
	// Held until Docker reports the process started: see execGates.
	done := c.gates.startShared(id)
	defer done()
	cctx, cancel := c.bounded(ctx)
	created, err := c.docker.ContainerExecCreate(cctx, id, container.ExecOptions{
		Cmd:          opts.Cmd,
		WorkingDir:   opts.WorkingDir,
		Env:          opts.Env,
		AttachStdin:  opts.Stdin != nil || opts.openStdin,
		AttachStdout: true,
		AttachStderr: true,
	})
	cancel()
	if err != nil {
		if cerrdefs.IsConflict(err) && strings.Contains(err.Error(), "is paused") {
			return "", types.HijackedResponse{}, fmt.Errorf("creating exec in %s: %w: %v", ShortID(id), ErrPaused, err)
		}
		return "", types.HijackedResponse{}, classify(err, "creating exec in "+ShortID(id))
	}
	attach, err := c.docker.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		return "", types.HijackedResponse{}, classify(err, "attaching to exec in "+ShortID(id))
	}
	sctx, cancel := c.bounded(ctx)
	c.awaitExecStarted(sctx, created.ID)
	cancel()
	if opts.Stdin != nil {
		go func() {
			_, _ = io.Copy(attach.Conn, opts.Stdin)
			_ = attach.CloseWrite()
		}()
	}
	return created.ID, attach, nil
}

// copyExecOutput demultiplexes an exec's stream. stdcopy's buffer grows only
// to the largest frame, and the daemon's frames are at most 32 KiB.
func copyExecOutput(r io.Reader, stdout, stderr io.Writer) error {
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	_, err := stdcopy.StdCopy(stdout, stderr, r)
	return err
}

// execExitCode reads an exec's exit code. The output stream can end a moment
// before the daemon records the exit, so a still-running exec is polled
// briefly.
func (c *Client) execExitCode(ctx context.Context, execID string) (int, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	for {
		inspect, err := c.docker.ContainerExecInspect(ctx, execID)
		if err != nil {
			return 0, classify(err, "inspecting exec")
		}
		if !inspect.Running {
			return inspect.ExitCode, nil
		}
		select {
		case <-ctx.Done():
			return 0, classify(ctx.Err(), "waiting for the exit code of exec "+ShortID(execID))
		case <-time.After(10 * time.Millisecond):
		}
	}
}
