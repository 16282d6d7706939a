package kubebackend

import (
	"context"
	"errors"

	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/session"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
)

// Processes implements session.ProcessDriver through the Sandbox's
// processes subresource: the handles and the output live in the sandbox,
// so any replica of this server answers for any handle.
func (b *driver) Processes(ctx context.Context, h session.Handle, call contract.ProcessCall) (execio.ProcessResponse, error) {
	sbx, err := b.lookup(ctx, h)
	if err == nil {
		sbx, err = b.running(ctx, sbx)
	}
	if err != nil {
		return execio.ProcessResponse{}, err
	}
	ref := sandboxclient.For(sbx)
	var (
		resp execio.ProcessResponse
		st   execio.ProcessStatus
		out  execio.ProcessOutput
	)
	switch call.Action {
	case execio.ProcessActionStart:
		st, err = b.nodes.StartProcess(ctx, ref, call.Command, call.CommandTimeout)
		resp.Process = &st
	case execio.ProcessActionList:
		resp.Processes, err = b.nodes.ListProcesses(ctx, ref)
	case execio.ProcessActionPoll:
		out, err = b.nodes.PollProcess(ctx, ref, call.Handle, call.StdoutOffset, call.StderrOffset)
		resp.Output = &out
	case execio.ProcessActionWait:
		out, err = b.nodes.WaitProcess(ctx, ref, call.Handle, call.StdoutOffset, call.StderrOffset, call.Timeout)
		resp.Output = &out
	case execio.ProcessActionKill:
		st, err = b.nodes.KillProcess(ctx, ref, call.Handle)
		resp.Process = &st
	case execio.ProcessActionStdin:
		st, err = b.nodes.WriteProcessStdin(ctx, ref, call.Handle, call.Stdin, call.CloseStdin)
		resp.Process = &st
	default:
		return resp, errors.New("unknown background process action " + call.Action)
	}
	return resp, processError(err)
}

// processError maps the processes subresource's own refusals onto execio's
// errors before clientError, which would take a missing process for a
// missing sandbox.
func processError(err error) error {
	switch {
	case err == nil:
		return nil
	case sandboxclient.IsProcessNotFound(err):
		return &messageError{kind: execio.ErrProcessNotFound, msg: statusMessage(err)}
	case sandboxclient.IsProcessLimit(err):
		return &messageError{kind: execio.ErrTooManyProcesses, msg: statusMessage(err)}
	case sandboxclient.IsProcessExited(err):
		return &messageError{kind: execio.ErrProcessExited, msg: statusMessage(err)}
	}
	return clientError(err)
}
