/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

// maxProcessBody bounds a processes request: the largest stdin write,
// base64-encoded in JSON (4/3), plus room for a start's command and env.
const maxProcessBody = execio.MaxProcessStdinWrite/3*4 + 4<<20

// serveProcesses answers one call on the Sandbox's background processes
// (execio.ProcessRequest). Each is a short call of the in-sandbox helper,
// so it takes one of the Sandbox's exec slots while it lasts; a wait holds
// it for at most execio.MaxProcessWait.
func (s *Server) serveProcesses(w http.ResponseWriter, r *http.Request, sbx *sandboxv1alpha1.Sandbox, ct dockerruntime.Container) {
	ctx := r.Context()
	if r.ContentLength > maxProcessBody {
		writeError(w, tooLarge("processes request is %d bytes, more than the %d allowed", r.ContentLength, maxProcessBody))
		return
	}
	release, lerr := s.limits.acquire(sbx.UID)
	if lerr != nil {
		writeError(w, lerr)
		return
	}
	defer release()
	body := http.MaxBytesReader(unwrapWriter(w), r.Body, maxProcessBody)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	var preq execio.ProcessRequest
	if err := dec.Decode(&preq); err != nil {
		var maxBytes *http.MaxBytesError
		if errors.As(err, &maxBytes) {
			writeError(w, tooLarge("processes request exceeds %d bytes", maxProcessBody))
			return
		}
		writeError(w, badRequest("processes request is not a JSON execio.ProcessRequest: %v", err))
		return
	}
	if err := checkProcessRequest(preq); err != nil {
		writeError(w, err)
		return
	}
	rt := s.cfg.Runtime
	var (
		resp execio.ProcessResponse
		err  error
	)
	switch preq.Action {
	case execio.ProcessActionStart:
		var req execio.Request
		// DecodeRequest bounds argv and env while it streams them.
		req, err = execio.DecodeRequest(bytes.NewReader(preq.Command))
		if err == nil {
			req, err = s.sandboxRequest(sbx, req)
		}
		if err != nil {
			break
		}
		var st execio.ProcessStatus
		handle := dockerruntime.NewProcessHandle()
		st, err = rt.StartProcess(ctx, ct.ID, handle, req, time.Duration(preq.TimeoutSeconds)*time.Second)
		resp.Process = &st
		if err == nil && s.cfg.Activity != nil {
			s.cfg.Activity.Background(sbx)
		}
		logf.FromContext(ctx).Info("background process started", "handle", handle, "command", truncatedArgv(req.Argv()), "error", errText(err))
	case execio.ProcessActionList:
		resp.Processes, err = rt.ListProcesses(ctx, ct.ID)
		if resp.Processes == nil {
			resp.Processes = []execio.ProcessStatus{}
		}
	case execio.ProcessActionPoll, execio.ProcessActionWait:
		var out execio.ProcessOutput
		off := dockerruntime.ProcessOffsets{Stdout: preq.StdoutOffset, Stderr: preq.StderrOffset}
		out, err = rt.WaitProcess(ctx, ct.ID, preq.Handle, off, time.Duration(preq.TimeoutMillis)*time.Millisecond)
		resp.Output = &out
	case execio.ProcessActionKill:
		var st execio.ProcessStatus
		st, err = rt.KillProcess(ctx, ct.ID, preq.Handle)
		resp.Process = &st
		logf.FromContext(ctx).Info("background process killed", "handle", preq.Handle, "error", errText(err))
	case execio.ProcessActionStdin:
		var st execio.ProcessStatus
		st, err = rt.WriteProcessStdin(ctx, ct.ID, preq.Handle, preq.Stdin, preq.CloseStdin)
		resp.Process = &st
	}
	if err != nil {
		writeError(w, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	_ = json.NewEncoder(w).Encode(&resp)
}

// checkProcessRequest refuses what the action does not take, before
// anything reaches the sandbox.
func checkProcessRequest(p execio.ProcessRequest) error {
	takesHandle := p.Action != execio.ProcessActionStart && p.Action != execio.ProcessActionList
	switch {
	case p.Action != execio.ProcessActionStart && p.Action != execio.ProcessActionList && p.Action != execio.ProcessActionPoll &&
		p.Action != execio.ProcessActionWait && p.Action != execio.ProcessActionKill && p.Action != execio.ProcessActionStdin:
		return badRequest("unknown processes action %q; use start, list, poll, wait, kill or stdin", p.Action).Because("FieldValueNotSupported", "action")
	case !takesHandle && p.Handle != "":
		return badRequest("%s takes no handle: the server mints handles", p.Action).Because("FieldValueForbidden", "handle")
	case takesHandle && !dockerruntime.ValidProcessHandle(p.Handle):
		return notFound("%q is not a background process handle", p.Handle).Because(subresource.CauseProcessNotFound, "handle")
	case (p.Action == execio.ProcessActionStart) != (len(p.Command) > 0):
		return badRequest("command is required by start and taken by nothing else").Because("FieldValueInvalid", "command")
	case p.Action != execio.ProcessActionStart && p.TimeoutSeconds != 0:
		return badRequest("only start takes timeoutSeconds").Because("FieldValueForbidden", "timeoutSeconds")
	case p.TimeoutSeconds < 0 || p.TimeoutSeconds > int64(execio.MaxTimeout/time.Second):
		return badRequest("timeoutSeconds must be between 0 (none) and %d", int64(execio.MaxTimeout/time.Second)).Because("FieldValueInvalid", "timeoutSeconds")
	case p.StdoutOffset < 0 || p.StderrOffset < 0:
		return badRequest("output offsets must not be negative").Because("FieldValueInvalid", "stdoutOffset")
	case p.TimeoutMillis < 0 || time.Duration(p.TimeoutMillis)*time.Millisecond > execio.MaxProcessWait:
		return badRequest("timeoutMillis must be between 0 and %d; wait again for longer", execio.MaxProcessWait.Milliseconds()).Because("FieldValueInvalid", "timeoutMillis")
	case p.Action == execio.ProcessActionPoll && p.TimeoutMillis != 0:
		return badRequest("poll does not wait; use wait").Because("FieldValueForbidden", "timeoutMillis")
	case p.Action != execio.ProcessActionStdin && (len(p.Stdin) > 0 || p.CloseStdin):
		return badRequest("only the stdin action writes stdin").Because("FieldValueForbidden", "stdin")
	case len(p.Stdin) > execio.MaxProcessStdinWrite:
		return tooLarge("a write to stdin is at most %d bytes, got %d", execio.MaxProcessStdinWrite, len(p.Stdin))
	}
	return nil
}

func truncatedArgv(argv []string) []string {
	var out []string
	n := 0
	for _, a := range argv {
		if n += len(a); n > 1024 || len(out) >= 32 {
			return append(out, "…")
		}
		out = append(out, a)
	}
	return out
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
