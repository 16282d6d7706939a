/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package nodeapi

import (
	"errors"
	"net/http"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

// apiError is a failure answered with a metav1.Status: the subresource
// API's one error type, shared with the aggregated API server.
type apiError = subresource.Error

func newError(code int, reason metav1.StatusReason, format string, args ...any) *apiError {
	return subresource.NewError(code, reason, format, args...)
}

func badRequest(format string, args ...any) *apiError {
	return newError(http.StatusBadRequest, metav1.StatusReasonBadRequest, format, args...)
}

func notFound(format string, args ...any) *apiError {
	return newError(http.StatusNotFound, metav1.StatusReasonNotFound, format, args...)
}

func conflict(format string, args ...any) *apiError {
	return newError(http.StatusConflict, metav1.StatusReasonConflict, format, args...)
}

func tooLarge(format string, args ...any) *apiError {
	return newError(http.StatusRequestEntityTooLarge, metav1.StatusReasonRequestEntityTooLarge, format, args...)
}

func tooManyRequests(format string, args ...any) *apiError {
	return tooMany(subresource.CauseExecLimit, format, args...)
}

// tooMany is a 429 with a Retry-After of a second, for the limit cause
// names.
func tooMany(cause metav1.CauseType, format string, args ...any) *apiError {
	e := newError(http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, format, args...)
	e.RetryAfter = time.Second
	return e.Because(cause, "")
}

func unavailable(err error) *apiError {
	e := newError(http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
		"the node's Docker Engine is unavailable; retry later: %v", err)
	e.RetryAfter = 5 * time.Second
	return e.Because(subresource.CauseRuntimeUnavailable, "")
}

// Status is the metav1.Status that writeError would answer err with, for
// the Sandbox name: for streams that already began, which end with it.
func Status(name string, err error) *metav1.Status {
	return classify(err).Status(name)
}

// streamStatus is the terminal Status of a stream that failed after its
// response began: err's reason, the cause subresource.CauseStreamFailed, and msg
// (when not empty) as its message.
func streamStatus(name string, err error, msg string) *metav1.Status {
	st := Status(name, err)
	st.Details.Causes = append(st.Details.Causes, metav1.StatusCause{Type: subresource.CauseStreamFailed})
	if msg != "" {
		st.Message = msg
	}
	return st
}

// writeError answers with err as a metav1.Status about the Sandbox that
// subresource.NameSandbox gave w. Errors that are not *apiError are
// classified by classify first.
func writeError(w http.ResponseWriter, err error) {
	subresource.WriteStatus(w, Status(subresource.SandboxName(w), err))
}

// classify maps the errors of execio and dockerruntime to HTTP answers,
// and leaves the rest to subresource.AsError. The message always keeps the
// original text, which names the offending value.
func classify(err error) *apiError {
	var e *apiError
	switch {
	case errors.As(err, &e):
		return e
	case errors.Is(err, execio.ErrInvalidPath):
		return badRequest("%v", err).Because(subresource.CauseInvalidPath, "path")
	case errors.Is(err, execio.ErrInvalidRequest),
		errors.Is(err, execio.ErrUnsupportedEntry):
		return badRequest("%v", err)
	case errors.Is(err, execio.ErrPathNotFound):
		return notFound("%v", err).Because(subresource.CausePathNotFound, "path")
	case errors.Is(err, execio.ErrTooLarge):
		return tooLarge("%v", err)
	case errors.Is(err, execio.ErrProcessNotFound):
		return notFound("%v", err).Because(subresource.CauseProcessNotFound, "handle")
	case errors.Is(err, execio.ErrTooManyProcesses):
		e := newError(http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, "%v", err).Because(subresource.CauseProcessLimit, "")
		e.RetryAfter = 5 * time.Second
		return e
	case errors.Is(err, execio.ErrProcessExited):
		return conflict("%v", err).Because(subresource.CauseProcessExited, "")
	case errors.Is(err, dockerruntime.ErrUnavailable):
		return unavailable(err)
	case errors.Is(err, dockerruntime.ErrNotFound):
		return conflict("the sandbox's container is gone: %v", err).Because(subresource.CauseContainerNotRunning, "")
	case errors.Is(err, dockerruntime.ErrPaused):
		return conflict("the sandbox is paused; set spec.paused to false to resume it: %v", err).Because(subresource.CauseSandboxPaused, "")
	}
	return subresource.AsError(err)
}

// unwrapWriter returns the server's own ResponseWriter beneath NameSandbox's
// wrapper: http.MaxBytesReader tells the server to close the connection
// after an oversized body only through an unexported method of it.
func unwrapWriter(w http.ResponseWriter) http.ResponseWriter {
	for {
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return w
		}
		w = u.Unwrap()
	}
}
