package dockerbackend

import (
	"context"
	"errors"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/session"
)

// Processes implements session.ProcessDriver through the runtime, straight
// to the sandbox's helper: the processes and their output live in the
// sandbox, so nothing here outlives a call.
func (b *driver) Processes(ctx context.Context, h session.Handle, call contract.ProcessCall) (execio.ProcessResponse, error) {
	if err := b.thawed(ctx, h); err != nil {
		return execio.ProcessResponse{}, err
	}
	var (
		resp execio.ProcessResponse
		err  error
		st   execio.ProcessStatus
		out  execio.ProcessOutput
	)
	switch call.Action {
	case execio.ProcessActionStart:
		st, err = b.docker.StartProcess(ctx, h.Ref, dockerruntime.NewProcessHandle(), call.Command, call.CommandTimeout)
		resp.Process = &st
	case execio.ProcessActionList:
		resp.Processes, err = b.docker.ListProcesses(ctx, h.Ref)
	case execio.ProcessActionPoll, execio.ProcessActionWait:
		out, err = b.docker.WaitProcess(ctx, h.Ref, call.Handle, dockerruntime.ProcessOffsets{Stdout: call.StdoutOffset, Stderr: call.StderrOffset}, call.Timeout)
		resp.Output = &out
	case execio.ProcessActionKill:
		st, err = b.docker.KillProcess(ctx, h.Ref, call.Handle)
		resp.Process = &st
	case execio.ProcessActionStdin:
		st, err = b.docker.WriteProcessStdin(ctx, h.Ref, call.Handle, call.Stdin, call.CloseStdin)
		resp.Process = &st
	default:
		return resp, errors.New("unknown background process action " + call.Action)
	}
	if errors.Is(err, dockerruntime.ErrNotFound) {
		b.forgetHistory(h.ID)
		return resp, session.Gone(mapErr(err))
	}
	return resp, mapErr(err)
}
