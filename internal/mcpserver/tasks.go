package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/tasks"
)

// The Tasks extension (package tasks) over the background process handles:
// a task is a handle, its status the process's state, its result what a
// foreground sandbox_exec of the command would have returned.

// taskSource is the tasks.Source of the server's backend.
type taskSource struct{ d *deps }

// createTask answers a sandbox_exec whose one command runs on as process
// st with a task (the request declared the extension). A st without its
// start time (a yielded command) is looked up, so that createdAt is the
// one tasks/get will report.
func (d *deps) createTask(ctx context.Context, caller contract.Caller, id string, r execio.Request, st execio.ProcessStatus) *mcp.CallToolResult {
	ref := tasks.Ref{ContainerID: id, Handle: st.Handle, TimeoutSeconds: int64((r.Timeout() + time.Second - 1) / time.Second)}
	if st.StartedAt.IsZero() {
		if found, err := (taskSource{d}).status(ctx, caller, ref); err == nil {
			st = found
		}
	}
	// The sandbox's end bounds the task's (ttlMs); unknown is unlimited.
	if sb, err := d.backend.Get(ctx, caller, id); err == nil && !sb.ExpiresAt.IsZero() {
		ref.ExpiresAt = sb.ExpiresAt.Unix()
	}
	t := workingTask(ref, st)
	t.TaskID = tasks.Mint(caller.ID, ref)
	return tasks.Created(t)
}

func workingTask(ref tasks.Ref, st execio.ProcessStatus) tasks.Task {
	created := st.StartedAt
	if created.IsZero() {
		created = time.Now()
	}
	return tasks.Task{
		Status: tasks.StatusWorking,
		StatusMessage: fmt.Sprintf("Running in sandbox %s as background process %s (exec_poll, exec_wait and exec_write_stdin act on it with that container_id and handle; tasks/cancel or exec_kill stops it).",
			ref.ContainerID, ref.Handle),
		CreatedAt:      tasks.Timestamp(created),
		LastUpdatedAt:  tasks.Timestamp(created),
		TTLMs:          tasks.TTL(created, ref.ExpiresAt),
		PollIntervalMs: tasks.PollInterval.Milliseconds(),
	}
}

// Get reads the process's state, and its output once it has exited.
func (s taskSource) Get(ctx context.Context, caller contract.Caller, ref tasks.Ref) (tasks.Task, error) {
	st, err := s.status(ctx, caller, ref)
	if err != nil {
		return tasks.Task{}, err
	}
	t := workingTask(ref, st)
	if st.State == execio.ProcessRunning {
		return t, nil
	}
	if st.EndedAt != nil {
		t.LastUpdatedAt = tasks.Timestamp(*st.EndedAt)
	}
	switch {
	case st.State == execio.ProcessLost || st.ExitCode == nil:
		// The command's outcome is unknown: no tool result can be made
		// of it, so this is the server's failure, not the tool's.
		t.Status = tasks.StatusFailed
		t.StatusMessage = fmt.Sprintf("The supervisor of background process %s was killed from inside sandbox %s, so its exit code is unknown; exec_poll with that handle shows its output.", ref.Handle, ref.ContainerID)
		t.Error = &tasks.ErrorObject{Code: mcp.INTERNAL_ERROR, Message: t.StatusMessage}
	case st.Killed:
		t.Status = tasks.StatusCancelled
		t.StatusMessage = fmt.Sprintf("Killed (tasks/cancel or exec_kill) with its whole process tree, exit code %d; exec_poll with container_id %s and handle %s shows its output.", *st.ExitCode, ref.ContainerID, ref.Handle)
	default:
		res, err := s.d.taskResult(ctx, caller, ref, st)
		if err != nil {
			return tasks.Task{}, err
		}
		t.Status = tasks.StatusCompleted
		t.StatusMessage = fmt.Sprintf("Exited with code %d.", *st.ExitCode)
		t.Result = res
	}
	return t, nil
}

// Cancel kills the process's tree (exec_kill).
func (s taskSource) Cancel(ctx context.Context, caller contract.Caller, ref tasks.Ref) error {
	_, err := s.d.processCall(ctx, caller, ref.ContainerID, contract.ProcessCall{Action: execio.ProcessActionKill, Handle: ref.Handle})
	return taskError(err)
}

// status finds the handle among its sandbox's processes: a list, which
// carries no output, so that polling a working task reads none.
func (s taskSource) status(ctx context.Context, caller contract.Caller, ref tasks.Ref) (execio.ProcessStatus, error) {
	resp, err := s.d.processCall(ctx, caller, ref.ContainerID, contract.ProcessCall{Action: execio.ProcessActionList})
	if err != nil {
		return execio.ProcessStatus{}, taskError(err)
	}
	for _, st := range resp.Processes {
		if st.Handle == ref.Handle {
			return st, nil
		}
	}
	return execio.ProcessStatus{}, fmt.Errorf("%w: background process %s is no longer kept in sandbox %s (the oldest finished ones are dropped past %d)",
		tasks.ErrUnknownTask, ref.Handle, ref.ContainerID, execio.MaxProcesses)
}

// taskError makes a handle or sandbox that is gone an unknown task.
func taskError(err error) error {
	if err != nil && (errors.Is(err, execio.ErrProcessNotFound) || errors.Is(err, contract.ErrNotFound)) {
		return fmt.Errorf("%w: %w", tasks.ErrUnknownTask, err)
	}
	return err
}

// taskResult is the sandbox_exec result of the exited process st: the end
// of each stream within the per-stream cap and the call's output budget,
// as a foreground run of the command would have shown it.
func (d *deps) taskResult(ctx context.Context, caller contract.Caller, ref tasks.Ref, st execio.ProcessStatus) (*mcp.CallToolResult, error) {
	limit := d.cfg.OutputLimit
	resp, err := d.processCall(ctx, caller, ref.ContainerID, contract.ProcessCall{Action: execio.ProcessActionPoll, Handle: ref.Handle,
		StdoutOffset: max(0, st.StdoutBytes-limit), StderrOffset: max(0, st.StderrBytes-limit)})
	if err != nil {
		return nil, taskError(err)
	}
	out := resp.Output
	keepOut, keepErr := fitShare(int(d.cfg.ExecOutputBudget), len(out.Stdout.Data), len(out.Stderr.Data))
	stdout, cutOut := tailText(out.Stdout, "stdout", keepOut)
	stderr, cutErr := tailText(out.Stderr, "stderr", keepErr)
	exit := -1
	if out.ExitCode != nil {
		exit = *out.ExitCode
	}
	var dur time.Duration
	if out.EndedAt != nil {
		dur = out.EndedAt.Sub(out.StartedAt)
	}
	timedOut := exit == 137 && ref.TimeoutSeconds > 0 && dur >= time.Duration(ref.TimeoutSeconds)*time.Second
	cr := CommandResult{Command: commandText(out.Command), ExitCode: exit, Stdout: stdout, Stderr: stderr,
		DurationMS: dur.Milliseconds(), Truncated: cutOut || cutErr, TimedOut: timedOut}
	er := ExecResult{ContainerID: ref.ContainerID, Success: exit == 0 && !timedOut, Results: []CommandResult{cr}}
	var text strings.Builder
	renderCommand(&text, cr, ref.TimeoutSeconds)
	if !er.Success {
		text.WriteString("Command 1 of 1 failed")
		if timedOut {
			text.WriteString(" (timed out).")
		} else {
			fmt.Fprintf(&text, " (exit code %d).", exit)
		}
	}
	res := result(er, strings.TrimRight(text.String(), "\n"))
	res.IsError = !er.Success
	res.ResultType = mcp.ResultTypeComplete
	return res, nil
}

// tailText is the end of c, at most keep bytes, after a marker when what
// is shown does not start at the stream's beginning (the ring, the cap or
// the budget dropped the start).
func tailText(c execio.StreamChunk, stream string, keep int) (string, bool) {
	b := c.Data
	dropped := c.Offset
	if len(b) > keep {
		dropped += int64(len(b) - max(keep, 0))
		b = b[len(b)-max(keep, 0):]
	}
	if dropped == 0 {
		return strings.ToValidUTF8(string(b), "\uFFFD"), false
	}
	for i := 0; i < utf8.UTFMax && len(b) > 0 && !utf8.RuneStart(b[0]); i++ {
		b, dropped = b[1:], dropped+1
	}
	return execio.TailMarker(stream, dropped) + strings.ToValidUTF8(string(b), "\uFFFD"), true
}
