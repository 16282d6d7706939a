package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/tasks"
)

// Background commands (issue 26): sandbox_exec's background and
// yield_after_seconds hand back a handle, and these tools act on it. The
// processes and their output live in the sandbox (the in-sandbox helper
// supervises them), so any replica of this server answers for any handle,
// and neither a restart of this server nor a client's disconnect ends them.

const (
	// DefaultYieldAfter is when a long foreground command of sandbox_exec
	// hands back a handle: below the 60 s many MCP clients give a tool
	// call.
	DefaultYieldAfter = 45 * time.Second
	// defaultProcessWait is exec_wait's default.
	defaultProcessWait = 30 * time.Second
	// yieldPollStep is how often a yielding command's new output is sent
	// as progress.
	yieldPollStep = time.Second
)

// ProcessResult is the structured result of the exec_* tools and of a
// backgrounded or yielded sandbox_exec command.
type ProcessResult struct {
	ContainerID string `json:"container_id"`
	// Handle names the process in exec_poll, exec_wait, exec_kill and
	// exec_write_stdin, with the same container_id.
	Handle  string `json:"handle"`
	Command string `json:"command"`
	// State is running, exited, or lost (its supervisor was killed from
	// inside the sandbox; the exit code is unknown).
	State    string `json:"state"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	// StdoutNext and StderrNext are the offsets to pass next time for
	// only the output after this.
	StdoutNext int64 `json:"stdout_next"`
	StderrNext int64 `json:"stderr_next"`
	// Dropped counts the bytes between the offsets asked for and what is
	// shown that the ring buffer (the last 512 KiB of each stream) no
	// longer held.
	Dropped int64 `json:"dropped,omitempty"`
}

// ProcessListResult is exec_list's structured result.
type ProcessListResult struct {
	ContainerID string          `json:"container_id"`
	Processes   []ProcessResult `json:"processes"`
}

type processArgs struct {
	ContainerID  string `json:"container_id"`
	Handle       string `json:"handle"`
	StdoutOffset int64  `json:"stdout_offset"`
	StderrOffset int64  `json:"stderr_offset"`
}

func (a processArgs) containerID() string { return a.ContainerID }

func (a processArgs) check() error {
	if a.Handle == "" {
		return argError(`"handle" is required: the handle that sandbox_exec returned (exec_list shows them)`)
	}
	if a.StdoutOffset < 0 || a.StderrOffset < 0 {
		return argError("stdout_offset and stderr_offset must not be negative")
	}
	return nil
}

type waitArgs struct {
	processArgs
	TimeoutSeconds *int64 `json:"timeout_seconds"`
}

type stdinArgs struct {
	ContainerID string `json:"container_id"`
	Handle      string `json:"handle"`
	Data        string `json:"data"`
	CloseStdin  bool   `json:"close_stdin"`
}

func (a stdinArgs) containerID() string { return a.ContainerID }

type killArgs struct {
	ContainerID string `json:"container_id"`
	Handle      string `json:"handle"`
}

func (a killArgs) containerID() string { return a.ContainerID }

func handleProp() mcp.ToolOption {
	return mcp.WithString("handle", mcp.Required(), mcp.Description("The process's handle, as sandbox_exec returned it (exec_list shows them)."))
}

func offsetProps() []mcp.ToolOption {
	return []mcp.ToolOption{
		mcp.WithInteger("stdout_offset", mcp.Description("Return stdout from this byte offset: the stdout_next of the previous result, for only what is new (default 0: all that is kept)."), mcp.Min(0)),
		mcp.WithInteger("stderr_offset", mcp.Description("Return stderr from this byte offset: the stderr_next of the previous result (default 0)."), mcp.Min(0)),
	}
}

// processes is the backend's ProcessBackend, or an error saying there is
// none.
func (d *deps) processes() (contract.ProcessBackend, error) {
	pb, ok := d.backend.(contract.ProcessBackend)
	if !ok {
		return nil, fmt.Errorf("%w: this server's backend runs no background processes", contract.ErrInvalid)
	}
	return pb, nil
}

// processCall runs one call and explains the process errors to the model.
func (d *deps) processCall(ctx context.Context, caller contract.Caller, id string, call contract.ProcessCall) (execio.ProcessResponse, error) {
	pb, err := d.processes()
	if err != nil {
		return execio.ProcessResponse{}, err
	}
	resp, err := pb.Processes(ctx, caller, id, call)
	switch {
	case err == nil:
		return resp, nil
	case errors.Is(err, execio.ErrProcessNotFound):
		return resp, fmt.Errorf("%w. Handles belong to one sandbox: pass the container_id it was started in (exec_list shows that sandbox's handles; finished ones are dropped, oldest first, past %d)", err, execio.MaxProcesses)
	case errors.Is(err, execio.ErrTooManyProcesses):
		return resp, fmt.Errorf("%w. Kill one with exec_kill (exec_list shows them), or wait for one to end", err)
	case errors.Is(err, execio.ErrProcessExited):
		return resp, fmt.Errorf("%w. Read its output and exit code with exec_poll", err)
	}
	return resp, err
}

func processResult(id string, st execio.ProcessStatus) ProcessResult {
	return ProcessResult{ContainerID: id, Handle: st.Handle, Command: commandText(st.Command), State: st.State, ExitCode: st.ExitCode,
		StdoutNext: st.StdoutBytes, StderrNext: st.StderrBytes}
}

func outputResult(id string, out execio.ProcessOutput) ProcessResult {
	r := processResult(id, out.ProcessStatus)
	r.Stdout = strings.ToValidUTF8(out.Stdout.Text("stdout"), "\uFFFD")
	r.Stderr = strings.ToValidUTF8(out.Stderr.Text("stderr"), "\uFFFD")
	r.StdoutNext, r.StderrNext = out.Stdout.Next, out.Stderr.Next
	r.Dropped = out.Stdout.Dropped + out.Stderr.Dropped
	return r
}

// commandText is the shell line of a sandbox_exec command (sh -c LINE),
// or the argv joined.
func commandText(argv []string) string {
	if len(argv) == 3 && argv[0] == "/bin/sh" && argv[1] == "-c" {
		return argv[2]
	}
	return strings.Join(argv, " ")
}

// renderProcess is a result's text: what the model reads.
func renderProcess(r ProcessResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "$ %s\n", r.Command)
	for _, s := range []string{r.Stdout, r.Stderr} {
		if s != "" {
			b.WriteString(s)
			if !strings.HasSuffix(s, "\n") {
				b.WriteString("\n")
			}
		}
	}
	switch {
	case r.State == execio.ProcessRunning:
		fmt.Fprintf(&b, "[still running; handle %s. Call exec_wait or exec_poll with container_id %s, handle %s, stdout_offset %d and stderr_offset %d for what follows; exec_kill stops it.]",
			r.Handle, r.ContainerID, r.Handle, r.StdoutNext, r.StderrNext)
	case r.State == execio.ProcessExited && r.ExitCode != nil:
		fmt.Fprintf(&b, "[exited with code %d; handle %s]", *r.ExitCode, r.Handle)
	default:
		fmt.Fprintf(&b, "[%s: its supervisor in the sandbox is gone and its exit code is unknown; handle %s]", r.State, r.Handle)
	}
	return b.String()
}

// failed reports whether a finished process failed (for isError).
func (r ProcessResult) failed() bool {
	return r.State == execio.ProcessLost || r.State == execio.ProcessExited && r.ExitCode != nil && *r.ExitCode != 0
}

func execPollTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	opts := append([]mcp.ToolOption{
		mcp.WithDescription(fmt.Sprintf("Read a background command's new output, state and exit code without waiting. The sandbox keeps the last %s of each of stdout and stderr per process; a marker shows what was dropped. An exited process reports isError when its exit code is not 0.", formatKiB(execio.ProcessRingBytes))),
		containerIDProp(), handleProp(),
	}, offsetProps()...)
	opts = append(opts, mcp.WithOutputSchema[ProcessResult](), annotations("Poll a background command", true, false, true, false))
	tool := mcp.NewTool("exec_poll", opts...)
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, args processArgs) (*mcp.CallToolResult, error) {
		if err := args.check(); err != nil {
			return nil, err
		}
		resp, err := d.processCall(ctx, caller, args.ContainerID, contract.ProcessCall{Action: execio.ProcessActionPoll, Handle: args.Handle,
			StdoutOffset: args.StdoutOffset, StderrOffset: args.StderrOffset})
		if err != nil {
			return nil, err
		}
		return processToolResult(outputResult(args.ContainerID, *resp.Output)), nil
	})
}

func execWaitTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	maxSecs := int(execio.MaxProcessWait / time.Second)
	opts := append([]mcp.ToolOption{
		mcp.WithDescription(fmt.Sprintf("Wait for a background command to exit, at most timeout_seconds (default %d, at most %d, below common tool-call limits), then return its new output, state and exit code as exec_poll does. Call it again while the state is running.", int(defaultProcessWait/time.Second), maxSecs)),
		containerIDProp(), handleProp(),
		mcp.WithInteger("timeout_seconds", mcp.Description(fmt.Sprintf("How long to wait (default %d, maximum %d).", int(defaultProcessWait/time.Second), maxSecs)), mcp.Min(0), mcp.Max(maxSecs)),
	}, offsetProps()...)
	opts = append(opts, mcp.WithOutputSchema[ProcessResult](), annotations("Wait for a background command", true, false, true, false))
	tool := mcp.NewTool("exec_wait", opts...)
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, args waitArgs) (*mcp.CallToolResult, error) {
		if err := args.check(); err != nil {
			return nil, err
		}
		timeout := defaultProcessWait
		if args.TimeoutSeconds != nil {
			if *args.TimeoutSeconds < 0 || *args.TimeoutSeconds > int64(maxSecs) {
				return nil, argError("timeout_seconds %d is out of range: 0 to %d", *args.TimeoutSeconds, maxSecs)
			}
			timeout = time.Duration(*args.TimeoutSeconds) * time.Second
		}
		resp, err := d.processCall(ctx, caller, args.ContainerID, contract.ProcessCall{Action: execio.ProcessActionWait, Handle: args.Handle,
			StdoutOffset: args.StdoutOffset, StderrOffset: args.StderrOffset, Timeout: timeout})
		if err != nil {
			return nil, err
		}
		return processToolResult(outputResult(args.ContainerID, *resp.Output)), nil
	})
}

func execKillTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("exec_kill",
		mcp.WithDescription("Kill a background command's whole process tree (its children, and theirs, however they detached). It then reports exit code 137. Killing a process that has already exited changes nothing."),
		containerIDProp(), handleProp(),
		mcp.WithOutputSchema[ProcessResult](),
		annotations("Kill a background command", false, true, true, false),
	)
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, args killArgs) (*mcp.CallToolResult, error) {
		if err := (processArgs{Handle: args.Handle}).check(); err != nil {
			return nil, err
		}
		resp, err := d.processCall(ctx, caller, args.ContainerID, contract.ProcessCall{Action: execio.ProcessActionKill, Handle: args.Handle})
		if err != nil {
			return nil, err
		}
		r := processResult(args.ContainerID, *resp.Process)
		return result(r, renderProcess(r)), nil
	})
}

func execWriteStdinTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("exec_write_stdin",
		mcp.WithDescription(fmt.Sprintf("Write text to a background command's stdin (at most %s per call), and close its stdin after when close_stdin is true. It waits while the command does not read. Include the newline an interactive program expects.", formatKiB(execio.MaxProcessStdinWrite))),
		containerIDProp(), handleProp(),
		mcp.WithString("data", mcp.Description(`Text to write, for example "yes\n".`)),
		mcp.WithBoolean("close_stdin", mcp.Description("Close stdin after writing (the program then reads end of file).")),
		mcp.WithOutputSchema[ProcessResult](),
		annotations("Write to a background command", false, false, false, false),
	)
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, args stdinArgs) (*mcp.CallToolResult, error) {
		if err := (processArgs{Handle: args.Handle}).check(); err != nil {
			return nil, err
		}
		if len(args.Data) > execio.MaxProcessStdinWrite {
			return nil, argError("data is %d bytes; one write takes at most %d", len(args.Data), execio.MaxProcessStdinWrite)
		}
		if args.Data == "" && !args.CloseStdin {
			return nil, argError(`nothing to do: pass "data", "close_stdin": true, or both`)
		}
		resp, err := d.processCall(ctx, caller, args.ContainerID, contract.ProcessCall{Action: execio.ProcessActionStdin, Handle: args.Handle,
			Stdin: []byte(args.Data), CloseStdin: args.CloseStdin})
		if err != nil {
			return nil, err
		}
		r := processResult(args.ContainerID, *resp.Process)
		return result(r, fmt.Sprintf("Wrote %d bytes to the stdin of %s%s.", len(args.Data), args.Handle, map[bool]string{true: " and closed it", false: ""}[args.CloseStdin])), nil
	})
}

func execListTool(d *deps) (mcp.Tool, server.ToolHandlerFunc) {
	tool := mcp.NewTool("exec_list",
		mcp.WithDescription(fmt.Sprintf("List a sandbox's background commands, running and finished, oldest first, with their handles and exit codes. A sandbox runs at most %d; starting one more drops the oldest finished one.", execio.MaxProcesses)),
		containerIDProp(),
		mcp.WithOutputSchema[ProcessListResult](),
		annotations("List background commands", true, false, true, false),
	)
	return typedTool(d, tool, func(ctx context.Context, _ mcp.CallToolRequest, caller contract.Caller, args containerArgs) (*mcp.CallToolResult, error) {
		resp, err := d.processCall(ctx, caller, args.ContainerID, contract.ProcessCall{Action: execio.ProcessActionList})
		if err != nil {
			return nil, err
		}
		out := ProcessListResult{ContainerID: args.ContainerID, Processes: []ProcessResult{}}
		var text strings.Builder
		for _, st := range resp.Processes {
			r := processResult(args.ContainerID, st)
			out.Processes = append(out.Processes, r)
			code := ""
			if r.ExitCode != nil {
				code = fmt.Sprintf(" (exit %d)", *r.ExitCode)
			}
			fmt.Fprintf(&text, "%s  %s%s  %s\n", r.Handle, r.State, code, Truncate(r.Command, 200))
		}
		if len(out.Processes) == 0 {
			text.WriteString("No background commands in this sandbox.")
		}
		return result(out, strings.TrimRight(text.String(), "\n")), nil
	})
}

func processToolResult(r ProcessResult) *mcp.CallToolResult {
	res := result(r, renderProcess(r))
	res.IsError = r.failed()
	return res
}

func formatKiB(n int) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

// startBackground is sandbox_exec with background: the one command starts
// detached and its handle comes back at once.
func (d *deps) startBackground(ctx context.Context, caller contract.Caller, id string, r execio.Request) (*mcp.CallToolResult, error) {
	timeout := r.Timeout()
	resp, err := d.processCall(ctx, caller, id, contract.ProcessCall{Action: execio.ProcessActionStart, Command: r, CommandTimeout: timeout})
	if err != nil {
		return nil, err
	}
	if tasks.Declared(ctx) {
		return d.createTask(ctx, caller, id, r, *resp.Process), nil
	}
	pr := processResult(id, *resp.Process)
	text := fmt.Sprintf("Started in the background: handle %s (container_id %s), killed after %s. Call exec_wait or exec_poll with both for its output and exit code, exec_write_stdin to feed it, exec_kill to stop it.", pr.Handle, id, timeout)
	return result(ExecResult{ContainerID: id, Success: true, Background: &pr}, text), nil
}

// runYielding runs one command of sandbox_exec detached and waits up to
// yield for it, sending its output as progress while it runs. done is
// false when it still runs at yield: the result then carries its handle.
func (d *deps) runYielding(ctx context.Context, caller contract.Caller, id string, r execio.Request, yield time.Duration, progress func(stream string, p []byte)) (pr ProcessResult, done bool, err error) {
	resp, err := d.processCall(ctx, caller, id, contract.ProcessCall{Action: execio.ProcessActionStart, Command: r, CommandTimeout: r.Timeout()})
	if err != nil {
		return pr, false, err
	}
	handle := resp.Process.Handle
	deadline := time.Now().Add(yield)
	var stdout, stderr strings.Builder
	var outOff, errOff, dropped int64
	for {
		step := min(yieldPollStep, max(time.Until(deadline), 0))
		resp, err = d.processCall(ctx, caller, id, contract.ProcessCall{Action: execio.ProcessActionWait, Handle: handle,
			StdoutOffset: outOff, StderrOffset: errOff, Timeout: step})
		if err != nil {
			return pr, false, err
		}
		out := resp.Output
		for _, s := range []struct {
			name  string
			chunk execio.StreamChunk
			b     *strings.Builder
		}{{"stdout", out.Stdout, &stdout}, {"stderr", out.Stderr, &stderr}} {
			text := s.chunk.Text(s.name)
			if len(text) > 0 {
				progress(s.name, []byte(text))
				// Keep the end within what a result shows.
				s.b.WriteString(text)
				if s.b.Len() > int(r.OutputLimitBytes) {
					keep := s.b.String()[s.b.Len()-int(r.OutputLimitBytes):]
					for len(keep) > 0 && !utf8.RuneStart(keep[0]) {
						keep = keep[1:]
					}
					s.b.Reset()
					s.b.WriteString(keep)
				}
			}
		}
		outOff, errOff = out.Stdout.Next, out.Stderr.Next
		dropped += out.Stdout.Dropped + out.Stderr.Dropped
		if out.State != execio.ProcessRunning || !time.Now().Before(deadline) {
			pr = outputResult(id, *out)
			pr.Stdout, pr.Stderr = strings.ToValidUTF8(stdout.String(), "\uFFFD"), strings.ToValidUTF8(stderr.String(), "\uFFFD")
			pr.Dropped = dropped
			return pr, out.State != execio.ProcessRunning, nil
		}
	}
}

// execYielding is sandbox_exec's run of one command that may outlast
// yield: its output goes to stdout and stderr as Exec's would; yielded is
// set when it still runs.
func (d *deps) execYielding(ctx context.Context, caller contract.Caller, id string, r execio.Request, yield time.Duration,
	progress func(string, []byte), stdout, stderr *execio.TailBuffer,
) (execio.Result, *ProcessResult, error) {
	started := time.Now()
	pr, done, err := d.runYielding(ctx, caller, id, r, yield, progress)
	if err != nil {
		return execio.Result{}, nil, err
	}
	_, _ = stdout.Write([]byte(pr.Stdout))
	_, _ = stderr.Write([]byte(pr.Stderr))
	res := execio.Result{DurationMillis: time.Since(started).Milliseconds(), StdoutBytes: pr.StdoutNext, StderrBytes: pr.StderrNext,
		StdoutTruncated: pr.Dropped > 0}
	switch {
	case !done:
		return res, &pr, nil
	case pr.ExitCode == nil:
		res.ExitCode = -1
	default:
		res.ExitCode = *pr.ExitCode
		// The helper's backstop killed it at its timeout.
		res.TimedOut = res.ExitCode == 137 && time.Since(started) >= r.Timeout()
	}
	return res, nil, nil
}

// renderYielded is the text of a command still running at yield.
func renderYielded(b *strings.Builder, cr CommandResult, pr ProcessResult, yield time.Duration, notRun int) {
	fmt.Fprintf(b, "$ %s\n", cr.Command)
	for _, s := range []string{cr.Stdout, cr.Stderr} {
		if s != "" {
			b.WriteString(s)
			if !strings.HasSuffix(s, "\n") {
				b.WriteString("\n")
			}
		}
	}
	fmt.Fprintf(b, "[still running after %s; it goes on in the background as handle %s. Call exec_wait with container_id %s, handle %s, stdout_offset %d and stderr_offset %d for what follows and its exit code; exec_kill stops it.]",
		yield, pr.Handle, pr.ContainerID, pr.Handle, pr.StdoutNext, pr.StderrNext)
	if notRun > 0 {
		fmt.Fprintf(b, "\nThe remaining %d command(s) were not run; run them once it has ended.", notRun)
	}
}
