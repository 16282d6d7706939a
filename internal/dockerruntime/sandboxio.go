package dockerruntime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxhelper/helperproto"
)

const (
	// helperBackstopGrace is how long after a command's timeout the helper
	// kills the tree by itself. It only matters when the manager is gone or
	// cannot start the kill exec (a sandbox at its pids limit); normally
	// the manager's kill comes first.
	helperBackstopGrace = 3 * time.Second
	// helperStderrMax bounds what is kept of a transfer helper's stderr.
	helperStderrMax = 64 << 10
)

// RunCommand runs req in the running sandbox container id, as the sandbox's
// user, through the in-sandbox helper. stdout and stderr receive the output
// as it arrives, each capped at req.OutputLimitBytes with a truncation
// marker. When the timeout fires, or ctx ends, the command's whole process
// tree is killed; a timeout is reported in the Result, a cancellation as
// ctx's error.
//
// The command's background children that outlive it (`server &`) are left
// running once its output has drained (or 150 ms after it exited); they are
// no longer killed by this call.
//
// The command runs in the sandbox's resident helper (see standby.go), which
// then waits for the sandbox's next command.
func (c *Client) RunCommand(ctx context.Context, id string, req execio.Request, stdout, stderr io.Writer) (execio.Result, error) {
	return c.runCommand(ctx, id, req, stdout, stderr, true)
}

// RunCommandOnce is RunCommand that leaves no resident helper behind, for a
// check after which the sandbox must hold no process of ours.
func (c *Client) RunCommandOnce(ctx context.Context, id string, req execio.Request, stdout, stderr io.Writer) (execio.Result, error) {
	return c.runCommand(ctx, id, req, stdout, stderr, false)
}

// HealthCheckTimeout bounds CheckHealth.
const HealthCheckTimeout = 10 * time.Second

// CheckHealth is a warm pool member's check before it is frozen: the
// helper's `check` (internal/sandboxhelper/check.go), run as a command the
// way every exec runs, leaving no process but the resident helper it ran
// in (so that a claimed member's first command finds that helper: see
// prestart.go), and no file. It needs nothing from the image. An error
// says what failed.
func (c *Client) CheckHealth(ctx context.Context, id string) error {
	stderr := &boundedBuffer{max: 4 << 10}
	res, err := c.RunCommand(ctx, id, execio.Request{
		Command: []string{HelperPath, "check"}, TimeoutSeconds: int64(HealthCheckTimeout / time.Second),
	}, nil, stderr)
	switch {
	case err != nil:
		return fmt.Errorf("health check of container %s: %w", ShortID(id), err)
	case res.TimedOut:
		return fmt.Errorf("health check of container %s: no answer within %s", ShortID(id), HealthCheckTimeout)
	case res.ExitCode != 0:
		msg := strings.TrimSpace(stderr.buf.String())
		if he, ok := helperproto.ParseError(stderr.buf.Bytes()); ok {
			msg = he.Message
		}
		return fmt.Errorf("health check of container %s failed (exit code %d): %s", ShortID(id), res.ExitCode, msg)
	}
	return nil
}

func (c *Client) runCommand(ctx context.Context, id string, req execio.Request, stdout, stderr io.Writer, keepHelper bool) (execio.Result, error) {
	req, err := req.Normalize()
	if err != nil {
		return execio.Result{}, err
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	runID := newRunID()
	timeout := req.Timeout()
	backstop := int64((timeout + helperBackstopGrace + time.Second - 1) / time.Second)
	if err := c.awaitThaw(ctx, id); err != nil {
		return execio.Result{}, err
	}
	if c.isLegacy(id) {
		return c.runCommandPerExec(ctx, id, req, stdout, stderr, runID, backstop)
	}
	request, err := json.Marshal(helperproto.ServeRequest{
		ID: runID, Argv: req.Argv(), Env: req.Env, WorkingDir: req.WorkingDir, Stdin: req.Stdin, BackstopSeconds: backstop,
	})
	if err != nil {
		return execio.Result{}, fmt.Errorf("encoding the command for the sandbox helper: %w", err)
	}
	// Handing the command over includes starting a helper, which on a
	// loaded host can take as long as Docker takes to spawn a process: it
	// may take as long as the command may run, not just a Docker call.
	s, err := c.acceptedServe(ctx, id, request, c.callTimeout+timeout)
	if errors.Is(err, errHelperWithoutServe) {
		c.markLegacy(id)
		return c.runCommandPerExec(ctx, id, req, stdout, stderr, runID, backstop)
	}
	if err != nil {
		return execio.Result{}, err
	}
	// The helper has the stdin: keep no copy of it while the command runs.
	req.Stdin = nil
	res, reusable, err := c.streamServe(ctx, s, req, stdout, stderr, runID)
	if reusable && keepHelper {
		c.park(id, s)
	} else {
		s.close()
	}
	return res, err
}

// acceptedServe hands the command to a helper that has taken it: the
// sandbox's idle one, or a new one when there is none, or when the idle one
// ended before taking the command (then it never ran, and runs once here).
// bound limits all of that.
func (c *Client) acceptedServe(ctx context.Context, id string, request []byte, bound time.Duration) (*serveExec, error) {
	actx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	c.awaitPrestart(actx, id)
	if s := c.takeStandby(id); s != nil {
		// A frozen helper would hold the command until its container
		// thaws, and run it then; Docker refuses an exec in a paused
		// container, and so does this.
		ct, err := c.Inspect(actx, id)
		switch {
		case err != nil:
			s.close()
			return nil, err
		case ct.State.Paused:
			c.park(id, s)
			return nil, fmt.Errorf("running a command in %s: %w", ShortID(id), ErrPaused)
		}
		err = s.request(actx, request)
		if err == nil {
			return s, nil
		}
		s.close()
		if !errors.Is(err, errNotAccepted) {
			return nil, err
		}
	}
	s, err := c.startServe(actx, id)
	if err != nil {
		return nil, err
	}
	if err := s.request(actx, request); err != nil {
		s.close()
		if !errors.Is(err, errNotAccepted) {
			return nil, err
		}
		code, ierr := c.execExitCode(context.WithoutCancel(ctx), s.execID)
		if ierr != nil {
			return nil, ierr
		}
		return nil, helperFailure("running a command in "+ShortID(id), code, s.stderr.Bytes())
	}
	return s, nil
}

// streamServe copies an accepted command's output until its exit frame,
// killing its tree on timeout, on ctx's end, or when a writer fails. The
// copy runs apart from the timers, so a caller's writer that blocks cannot
// hold off the kill. reusable says the helper ended the command by the
// protocol and may take another.
func (c *Client) streamServe(ctx context.Context, s *serveExec, req execio.Request, stdout, stderr io.Writer, runID string) (res execio.Result, reusable bool, err error) {
	start := time.Now()
	outCap := execio.NewCapWriter(stdout, req.OutputLimitBytes, "stdout")
	errCap := execio.NewCapWriter(stderr, req.OutputLimitBytes, "stderr")
	type outcome struct {
		exitCode int
		exited   bool
		err      error // the helper's protocol broken
		writeErr error // a writer failed
	}
	done := make(chan outcome, 1)
	writerFailed := make(chan struct{})
	go func() {
		var o outcome
		defer func() { done <- o }()
		for f := range s.frames {
			switch f.kind {
			case helperproto.FrameStdout, helperproto.FrameStderr:
				if o.writeErr == nil {
					w := io.Writer(outCap)
					if f.kind == helperproto.FrameStderr {
						w = errCap
					}
					if _, err := w.Write(f.payload); err != nil {
						// The caller is gone; the command must not run on.
						o.writeErr = err
						close(writerFailed)
					}
				}
				f.release()
			case helperproto.FrameExit:
				o.exitCode, o.err = helperproto.ParseExit(f.payload)
				o.exited = o.err == nil
				f.release()
				return
			default:
				o.err = fmt.Errorf("the sandbox helper sent a %q frame during command %s", f.kind, runID)
				f.release()
				return
			}
		}
		o.err = s.streamErr
	}()

	timer := time.NewTimer(req.Timeout())
	defer timer.Stop()
	var (
		cancelled    error
		killDeadline <-chan time.Time
		killFallback <-chan time.Time
		ctxDone      = ctx.Done()
		o            outcome
	)
	kill := func() {
		if killDeadline == nil {
			// A failed send is a helper already gone: the end of its stdin
			// kills the tree too.
			_ = s.send(helperproto.FrameKill, []byte(runID))
			killFallback = time.After(c.callTimeout)
			killDeadline = time.After(helperBackstopGrace + 2*c.callTimeout)
		}
	}
wait:
	for {
		select {
		case o = <-done:
			break wait
		case <-timer.C:
			res.TimedOut = true
			kill()
		case <-ctxDone:
			ctxDone = nil
			cancelled = ctx.Err()
			kill()
		case <-writerFailed:
			writerFailed = nil
			kill()
		case <-killFallback:
			// The helper has not ended the command a Docker call's time
			// after the kill frame (stopped, or not reading its stdin):
			// kill the run as the legacy path does, with an exec of its
			// own, which needs nothing from the serving helper.
			killFallback = nil
			go func() { _ = c.killRun(context.WithoutCancel(ctx), s.container, runID) }()
		case <-killDeadline:
			s.close()
			<-done
			res.DurationMillis = time.Since(start).Milliseconds()
			return res, false, fmt.Errorf("command %s in sandbox %s did not end after being killed", runID, ShortID(s.container))
		}
	}
	res.DurationMillis = time.Since(start).Milliseconds()
	res.StdoutBytes, res.StdoutTruncated = outCap.Written(), outCap.Truncated()
	res.StderrBytes, res.StderrTruncated = errCap.Written(), errCap.Truncated()
	res.ExitCode = o.exitCode
	switch {
	case cancelled != nil:
		return res, o.exited, fmt.Errorf("running command in sandbox %s: %w", ShortID(s.container), cancelled)
	case o.writeErr != nil:
		return res, o.exited, classify(o.writeErr, "streaming command output from "+ShortID(s.container))
	case o.err != nil:
		if killDeadline == nil {
			kill()
		}
		return res, false, fmt.Errorf("reading the sandbox helper in %s: %w", ShortID(s.container), o.err)
	case o.exited:
		return res, true, nil
	}
	// The stream ended without an exit frame: the helper was killed (from
	// inside the sandbox, or by the OOM killer) or its container stopped.
	// Docker's record of the exec has the exit code, as for any exec.
	code, err := c.execExitCode(context.WithoutCancel(ctx), s.execID)
	res.ExitCode = code
	return res, false, err
}

// runCommandPerExec runs a command in a sandbox whose helper predates
// serve: one exec of `helper run` per command, a second exec to kill it,
// the exit code from the exec's inspection.
func (c *Client) runCommandPerExec(ctx context.Context, id string, req execio.Request, stdout, stderr io.Writer, runID string, backstop int64) (execio.Result, error) {
	timeout := req.Timeout()
	argv := append([]string{HelperPath, "run", "--id=" + runID, "--backstop=" + strconv.FormatInt(backstop, 10), "--"}, req.Argv()...)
	opts := ExecOptions{Cmd: argv, WorkingDir: req.WorkingDir, Env: req.Env}
	if req.Stdin != nil {
		opts.Stdin = bytes.NewReader(req.Stdin)
	}
	execID, attach, err := c.startExec(ctx, id, opts)
	if err != nil {
		return execio.Result{}, err
	}
	defer attach.Close()
	start := time.Now()
	outCap := execio.NewCapWriter(stdout, req.OutputLimitBytes, "stdout")
	errCap := execio.NewCapWriter(stderr, req.OutputLimitBytes, "stderr")
	copyDone := make(chan error, 1)
	go func() { copyDone <- copyExecOutput(attach.Reader, outCap, errCap) }()

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var (
		res       execio.Result
		cancelled error
		copyErr   error
		finished  bool
	)
	select {
	case copyErr = <-copyDone:
		// The helper ended, or the caller's writer or Docker failed; in the
		// latter cases the tree may still run and is killed below.
		finished = copyErr == nil
	case <-timer.C:
		res.TimedOut = true
	case <-ctx.Done():
		cancelled = ctx.Err()
	}
	if !finished {
		// The caller may be gone; the kill must still happen.
		killErr := c.killRun(context.WithoutCancel(ctx), id, runID)
		if copyErr == nil {
			select {
			case copyErr = <-copyDone:
			case <-time.After(helperBackstopGrace + c.callTimeout):
				attach.Close()
				<-copyDone //nolint:errcheck // the copy ends with the closed attachment; its error adds nothing
				res.DurationMillis = time.Since(start).Milliseconds()
				return res, fmt.Errorf("command %s in sandbox %s did not end after being killed (kill: %v)", runID, ShortID(id), killErr)
			}
		}
	}
	res.DurationMillis = time.Since(start).Milliseconds()
	res.StdoutBytes, res.StdoutTruncated = outCap.Written(), outCap.Truncated()
	res.StderrBytes, res.StderrTruncated = errCap.Written(), errCap.Truncated()
	if cancelled != nil {
		return res, fmt.Errorf("running command in sandbox %s: %w", ShortID(id), cancelled)
	}
	if copyErr != nil {
		return res, classify(copyErr, "streaming command output from "+ShortID(id))
	}
	res.ExitCode, err = c.execExitCode(context.WithoutCancel(ctx), execID)
	return res, err
}

// killRun kills the process tree of one RunCommand through a second exec:
// Docker cannot kill an exec (moby#9098).
func (c *Client) killRun(ctx context.Context, id, runID string) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	stderr := &boundedBuffer{max: helperStderrMax}
	res, err := c.Exec(ctx, id, ExecOptions{Cmd: []string{HelperPath, "kill", runID}}, io.Discard, stderr)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return helperFailure("killing "+runID, res.ExitCode, stderr.buf.Bytes())
	}
	return nil
}

func newRunID() string { return "run-" + randid.Hex(12) }

// CopyIn extracts a tar stream into dest inside the sandbox. Only regular
// files and directories are accepted; the helper opens every path beneath
// dest.Root and never follows a symlink out of it.
//
// The archive is sanitised on the way (execio.SanitizeTar) and checked again
// by the helper. Extraction is streamed, so an archive rejected part way
// leaves the entries before the offending one extracted.
func (c *Client) CopyIn(ctx context.Context, id string, dest execio.Target, archive io.Reader, limits execio.UploadLimits) (execio.TransferStats, error) {
	if err := execio.CheckTarget(dest); err != nil {
		return execio.TransferStats{}, err
	}
	limits, err := limits.Normalize()
	if err != nil {
		return execio.TransferStats{}, err
	}
	if err := c.awaitThaw(ctx, id); err != nil {
		return execio.TransferStats{}, err
	}
	type sanitized struct {
		stats execio.TransferStats
		err   error
	}
	pr, pw := io.Pipe()
	done := make(chan sanitized, 1)
	go func() {
		stats, err := execio.SanitizeTar(archive, pw, limits)
		pw.CloseWithError(err)
		done <- sanitized{stats, err}
	}()
	where := fmt.Sprintf("uploading to %s in sandbox %s", joinTarget(dest), ShortID(id))
	// An archive that fits in a request goes to the resident helper in
	// one (transfer_serve.go); a larger one, or one the sanitiser refused
	// part way, streams to it in frames (streamUntar), or through an exec
	// where the helper is too old for that.
	// Read as it comes, not into a buffer of serveUploadMax+1 each time:
	// a 1 KiB write_file then allocates about 1 KiB, not 4 MiB.
	prefix, rerr := io.ReadAll(io.LimitReader(pr, serveUploadMax+1))
	if rerr == nil {
		if len(prefix) <= serveUploadMax {
			rerr = io.EOF
		}
	}
	var stdin io.Reader
	var s *sanitized
	switch {
	case rerr == nil:
		// Larger: the rest follows the prefix.
		stdin = io.MultiReader(bytes.NewReader(prefix), pr)
	case errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF):
		got := <-done
		s = &got
		stderr := &boundedBuffer{max: helperStderrMax}
		code, handled, err := c.runInHelper(ctx, id, untarArgv(dest, limits), prefix, io.Discard, stderr)
		if handled {
			switch {
			case err != nil:
				return s.stats, err
			case code != 0:
				return s.stats, helperFailure(where, code, stderr.buf.Bytes())
			}
			return s.stats, nil
		}
		stdin = bytes.NewReader(prefix)
	default:
		// The sanitiser's verdict: the helper gets the archive cut there.
		got := <-done
		s = &got
		stdin = io.MultiReader(bytes.NewReader(prefix), failingReader{rerr})
	}
	stderr := &boundedBuffer{max: helperStderrMax}
	// A larger archive streams to the resident helper in frames; one that
	// is older than that (or has no serve) gets an exec of its own.
	var res ExecResult
	errHelperGone := errors.New("the sandbox helper stopped reading the upload")
	code, handled, execErr := c.streamUntar(ctx, id, dest, limits, stdin, func() { pr.CloseWithError(errHelperGone) }, stderr)
	if handled {
		res.ExitCode = code
	} else {
		res, execErr = c.Exec(ctx, id, ExecOptions{Cmd: untarArgv(dest, limits), Stdin: coalesced{stdin}}, io.Discard, stderr)
	}
	// Unblock the sanitiser if the helper stopped reading early.
	pr.CloseWithError(errHelperGone)
	if s == nil {
		got := <-done
		s = &got
	}
	switch {
	case s.err != nil && !errors.Is(s.err, errHelperGone):
		// The sanitiser's verdict names the offending entry.
		return s.stats, fmt.Errorf("%s: %w", where, s.err)
	case execErr != nil:
		return s.stats, execErr
	case res.ExitCode != 0:
		return s.stats, helperFailure(where, res.ExitCode, stderr.buf.Bytes())
	}
	return s.stats, nil
}

// CopyOut writes a tar of src (a file or a tree) to w, stopping with
// execio.ErrTooLarge once maxBytes of file content have been sent (zero
// means execio.DefaultDownloadLimit). The helper enforces the cap too; this
// side recounts from the stream, and also bounds the tar framing, so a
// helper tampered with from inside the sandbox cannot flood the caller.
func (c *Client) CopyOut(ctx context.Context, id string, src execio.Target, w io.Writer, maxBytes int64) (execio.TransferStats, error) {
	if err := execio.CheckTarget(src); err != nil {
		return execio.TransferStats{}, err
	}
	if maxBytes < 0 {
		return execio.TransferStats{}, fmt.Errorf("%w: maxBytes %d is negative", execio.ErrInvalidRequest, maxBytes)
	}
	if maxBytes == 0 {
		maxBytes = execio.DefaultDownloadLimit
	}
	if err := c.awaitThaw(ctx, id); err != nil {
		return execio.TransferStats{}, err
	}
	where := fmt.Sprintf("downloading %s from sandbox %s", joinTarget(src), ShortID(id))
	return forwardTarOut(ctx, w, maxBytes, where, func(out, stderr io.Writer) (ExecResult, error) {
		// Through the resident helper (transfer_serve.go), or an exec for a
		// helper without serve.
		code, handled, err := c.runInHelper(ctx, id, tarArgv(src, maxBytes), nil, out, stderr)
		if !handled {
			return c.Exec(ctx, id, ExecOptions{Cmd: tarArgv(src, maxBytes)}, out, stderr)
		}
		return ExecResult{ExitCode: code}, err
	})
}

// forwardTarOut runs a helper that writes a tar (run, given the pipe to
// write it to and a bounded stderr) and forwards the tar to w through
// execio.ForwardTar, which recounts its content and framing against
// maxBytes, so that a helper tampered with from inside the sandbox cannot
// flood the caller. where names the operation in errors.
func forwardTarOut(ctx context.Context, w io.Writer, maxBytes int64, where string, run func(out, stderr io.Writer) (ExecResult, error)) (execio.TransferStats, error) {
	type counted struct {
		stats execio.TransferStats
		err   error
	}
	pr, pw := io.Pipe()
	done := make(chan counted, 1)
	go func() {
		stats, err := execio.ForwardTar(ctx, pr, w, maxBytes)
		// Failing the pipe fails the helper's output copy, which closes its
		// stream and so stops it (EPIPE).
		pr.CloseWithError(err)
		done <- counted{stats, err}
	}()
	stderr := &boundedBuffer{max: helperStderrMax}
	res, execErr := run(pw, stderr)
	pw.CloseWithError(execErr)
	s := <-done
	switch {
	case execErr == nil && res.ExitCode != 0:
		return s.stats, helperFailure(where, res.ExitCode, stderr.buf.Bytes())
	case s.err != nil:
		if errors.Is(s.err, execio.ErrTooLarge) {
			return s.stats, fmt.Errorf("%s: %w", where, s.err)
		}
		if execErr != nil {
			return s.stats, execErr
		}
		return s.stats, fmt.Errorf("%s: %w", where, s.err)
	case execErr != nil:
		return s.stats, execErr
	}
	return s.stats, nil
}

func joinTarget(t execio.Target) string {
	if t.Rel == "" {
		return t.Root
	}
	return t.Root + "/" + t.Rel
}

// execUploadChunk is the size of the writes coalesced feeds to an exec's
// stream.
const execUploadChunk = 1 << 20

// coalesced is an upload's stdin, written to the exec's connection in
// chunks of up to execUploadChunk (io.Copy uses WriteTo): the sanitiser's pipe
// hands over a tar header or at most 32 KiB at a time, and every write on
// the connection is a wake-up of dockerd, then of the shim and the helper,
// which on a loaded host made a 100 MiB restore 2-3 times slower than raw
// Docker fed from one buffer. An error from r ends the stream after what
// was read before it, as io.Copy would.
type coalesced struct{ r io.Reader }

func (c coalesced) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c coalesced) WriteTo(w io.Writer) (int64, error) {
	buf := make([]byte, execUploadChunk)
	var total int64
	for {
		n, err := io.ReadFull(c.r, buf)
		if n > 0 {
			m, werr := w.Write(buf[:n])
			total += int64(m)
			if werr != nil {
				return total, werr
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return total, nil
		default:
			return total, err
		}
	}
}
