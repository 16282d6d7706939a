/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"sync"
	"time"

	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/history"
	"github.com/code-sandbox/code-sandbox-operator/internal/randid"
)

// maxExecBody bounds an exec request: the largest stdin, base64-encoded in
// JSON (4/3), plus room for the command and environment.
const maxExecBody = execio.MaxStdin/3*4 + 4<<20

// serveExec runs one command and streams its output as NDJSON frames.
func (s *Server) serveExec(w http.ResponseWriter, r *http.Request, sbx *sandboxv1alpha1.Sandbox, ct dockerruntime.Container) {
	ctx := r.Context()
	log := logf.FromContext(ctx)

	if r.ContentLength > maxExecBody {
		writeError(w, tooLarge("exec request is %d bytes, more than the %d allowed", r.ContentLength, maxExecBody))
		return
	}
	// The slot is taken before the body is decoded: decoding holds memory
	// (up to the stdin cap several times over), and the node-wide limit is
	// what bounds how many requests can do that at once.
	release, lerr := s.limits.acquire(sbx.UID)
	if lerr != nil {
		writeError(w, lerr)
		return
	}
	defer release()
	body := io.Reader(http.MaxBytesReader(unwrapWriter(w), r.Body, maxExecBody))
	// The body budget is taken before the body is read, too: its stdin
	// stays in memory (decoded, and once more on its way to the helper)
	// until the helper has it, and the slots alone would let --max-execs
	// requests of the largest size do that at once.
	if s.bodies != nil {
		br := &budgetReader{r: body, b: s.bodies}
		if r.ContentLength > 0 {
			if r.ContentLength > s.bodies.max {
				writeError(w, tooLarge("exec request is %d bytes, more than the node's whole exec body budget of %d; send less stdin (a file upload streams)",
					r.ContentLength, s.bodies.max))
				return
			}
			if err := s.bodies.reserve(r.ContentLength); err != nil {
				writeError(w, s.budgetRefusal(r.ContentLength))
				return
			}
			br.reserved = r.ContentLength
		}
		defer br.release()
		body = br
	}
	// DecodeRequest bounds argv and env while streaming them, before they
	// are decoded whole.
	req, err := execio.DecodeRequest(body)
	if err != nil {
		var maxBytes *http.MaxBytesError
		switch {
		case errors.Is(err, errBudgetExhausted):
			writeError(w, s.budgetRefusal(-1))
		case errors.As(err, &maxBytes):
			writeError(w, tooLarge("exec request exceeds %d bytes", maxExecBody))
		case errors.Is(err, execio.ErrInvalidRequest):
			writeError(w, err)
		default:
			writeError(w, badRequest("exec request is not a JSON execio.Request: %v", err))
		}
		return
	}
	req, err = s.sandboxRequest(sbx, req)
	if err != nil {
		writeError(w, err)
		return
	}

	// The caller leaving (or a failed write to it) cancels the command, and
	// the runtime then kills its whole process tree.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fw := &frameWriter{rc: http.NewResponseController(w), enc: json.NewEncoder(w), cancel: cancel}

	h := w.Header()
	h.Set("Content-Type", subresource.ContentTypeNDJSON)
	h.Set("X-Content-Type-Options", "nosniff")
	// Proxies such as nginx would otherwise buffer the stream.
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// Headers out now, so that the client knows the command started even
	// if it prints nothing for a while.
	_ = fw.rc.Flush()

	// The record (and the log line) carry the command cut to
	// history.MaxCommandBytes: a command line may be megabytes long.
	rec := history.Bound(history.Record{
		ID:         newExecID(),
		Command:    req.Command,
		Shell:      req.Shell,
		WorkingDir: req.WorkingDir,
		StartedAt:  time.Now().UTC(),
		Caller:     callerName(ctx),
	})
	log.V(1).Info("exec starting", "exec", rec.ID, "command", rec.Command, "shell", rec.Shell)
	res, runErr := s.cfg.Runtime.RunCommand(ctx, ct.ID, req, fw.stream(subresource.StreamStdout), fw.stream(subresource.StreamStderr))

	rec.DurationMillis = res.DurationMillis
	if rec.DurationMillis == 0 {
		rec.DurationMillis = time.Since(rec.StartedAt).Milliseconds()
	}
	rec.ExitCode, rec.TimedOut, rec.Truncated = res.ExitCode, res.TimedOut, res.Truncated()
	var final subresource.Frame
	if runErr != nil {
		rec.ExitCode = -1
		if r.Context().Err() != nil {
			rec.Error = "the caller disconnected; the command was killed"
		} else if fw.failed() != nil {
			rec.Error = fmt.Sprintf("writing output to the caller failed (%v); the command was killed", fw.failed())
		} else {
			rec.Error = runErr.Error()
		}
		final.Error = rec.Error
		final.Status = streamStatus(sbx.Name, runErr, rec.Error)
	} else {
		final.Result = &res
	}
	if err := s.cfg.History.Append(string(sbx.UID), rec); err != nil {
		log.Error(err, "recording exec history", "exec", rec.ID)
	}
	log.Info("exec finished", "exec", rec.ID, "exitCode", rec.ExitCode, "durationMillis", rec.DurationMillis,
		"timedOut", rec.TimedOut, "truncated", rec.Truncated, "error", rec.Error)
	_ = fw.write(final)
}

// sandboxRequest applies the Sandbox's defaults and the node's limits to a
// command request: exec's and a background process's alike.
func (s *Server) sandboxRequest(sbx *sandboxv1alpha1.Sandbox, req execio.Request) (execio.Request, error) {
	// Relative working directories are relative to the Sandbox's own, as
	// file paths are.
	switch {
	case req.WorkingDir == "":
		req.WorkingDir = workingDir(sbx)
	case !path.IsAbs(req.WorkingDir):
		req.WorkingDir = path.Join(workingDir(sbx), req.WorkingDir)
	}
	// A Sandbox that took over a warm pool member was created before its
	// env was known: the env applies to every exec instead, so setting it
	// never costs a cold start (so was a fork served by a member). The
	// request's own variables come last and win.
	if (sbx.Spec.WarmPoolRef != nil || sbx.ContainerUID() != sbx.UID) && len(sbx.Spec.Env) > 0 {
		env := make([]string, 0, len(sbx.Spec.Env)+len(req.Env))
		for _, e := range sbx.Spec.Env {
			env = append(env, e.Name+"="+e.Value)
		}
		req.Env = append(env, req.Env...)
	}
	// The request may ask for a smaller cap, never a larger one than the
	// node allows.
	if req.OutputLimitBytes <= 0 || req.OutputLimitBytes > s.cfg.ExecOutputLimit {
		req.OutputLimitBytes = s.cfg.ExecOutputLimit
	}
	return req.Normalize()

}

// frameWriter writes NDJSON frames and flushes each, so output reaches the
// caller as the command produces it. stdout and stderr arrive from two
// goroutines; the mutex keeps frames whole.
type frameWriter struct {
	mu     sync.Mutex
	rc     *http.ResponseController
	enc    *json.Encoder
	cancel context.CancelFunc
	err    error
}

func (fw *frameWriter) write(f subresource.Frame) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.err != nil {
		return fw.err
	}
	err := fw.enc.Encode(&f)
	if err == nil {
		err = fw.rc.Flush()
	}
	if err != nil {
		// Nobody reads the output any more: stop the command rather than
		// let it run for no one.
		fw.err = fmt.Errorf("writing exec output: %w", err)
		fw.cancel()
	}
	return fw.err
}

func (fw *frameWriter) failed() error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	return fw.err
}

// stream is an io.Writer that turns each write into one output frame.
func (fw *frameWriter) stream(name string) streamWriter { return streamWriter{fw: fw, name: name} }

type streamWriter struct {
	fw   *frameWriter
	name string
}

func (s streamWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	// Encode copies p (as base64) before returning, so the caller may reuse
	// its buffer.
	if err := s.fw.write(subresource.Frame{Stream: s.name, Data: p}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// budgetRefusal is the 429 of an exec request that does not fit in what
// remains of the node's exec body budget; size is its declared length, or
// negative when it was undeclared and ran out while being read.
func (s *Server) budgetRefusal(size int64) *apiError {
	s.bodies.mu.Lock()
	used := s.bodies.used
	s.bodies.mu.Unlock()
	if size < 0 {
		return tooManyRequests("this node already holds %d bytes of exec requests, and this one's body went past its %d byte budget while it was read; retry later, or send less stdin (a file upload streams)",
			used, s.bodies.max)
	}
	return tooManyRequests("this node already holds %d bytes of exec requests and this one is %d more, past its %d byte budget; retry later, or send less stdin (a file upload streams)",
		used, size, s.bodies.max)
}

// newExecID names one exec in the history: random, so IDs stay unique
// across manager restarts.
func newExecID() string { return randid.Hex(8) }
