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
	"net/http"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/nodeapi/wire"
)

// apiError is a failure answered with a metav1.Status, as the API server
// answers, so that clients can reuse apimachinery's error helpers
// (apierrors.FromObject and friends) on the body. Its details name the
// Sandbox and carry the wire.Cause* that says precisely why.
type apiError struct {
	code    int
	reason  metav1.StatusReason
	message string
	// causes become details.causes.
	causes []metav1.StatusCause
	// retryAfter, when set, becomes a Retry-After header.
	retryAfter time.Duration
}

func (e *apiError) Error() string { return e.message }

// because adds a cause (a wire.Cause*) about field (may be empty).
func (e *apiError) because(t metav1.CauseType, field string) *apiError {
	e.causes = append(e.causes, metav1.StatusCause{Type: t, Field: field})
	return e
}

// WithCause adds a cause (a wire.Cause*) to an error made by NewError.
func WithCause(err error, t metav1.CauseType) error {
	var e *apiError
	if errors.As(err, &e) {
		e.causes = append(e.causes, metav1.StatusCause{Type: t})
	}
	return err
}

func newError(code int, reason metav1.StatusReason, format string, args ...any) *apiError {
	return &apiError{code: code, reason: reason, message: fmt.Sprintf(format, args...)}
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
	return tooMany(wire.CauseExecLimit, format, args...)
}

// tooMany is a 429 with a Retry-After of a second, for the limit cause
// names.
func tooMany(cause metav1.CauseType, format string, args ...any) *apiError {
	e := newError(http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, format, args...)
	e.retryAfter = time.Second
	return e.because(cause, "")
}

func unavailable(err error) *apiError {
	e := newError(http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
		"the node's Docker Engine is unavailable; retry later: %v", err)
	e.retryAfter = 5 * time.Second
	return e.because(wire.CauseRuntimeUnavailable, "")
}

// routeError turns a path that names no route into its answer.
func routeError(e *wire.RouteError) *apiError {
	switch e.Code {
	case http.StatusBadRequest:
		return newError(e.Code, metav1.StatusReasonBadRequest, "%s", e.Message)
	case http.StatusMethodNotAllowed:
		return newError(e.Code, metav1.StatusReasonMethodNotAllowed, "%s", e.Message)
	}
	return newError(e.Code, metav1.StatusReasonNotFound, "%s", e.Message).because(wire.CauseNoSuchEndpoint, "")
}

// NewError is a failure that WriteError answers with code and reason; the
// aggregated API server answers with it too.
func NewError(code int, reason metav1.StatusReason, format string, args ...any) error {
	return newError(code, reason, format, args...)
}

// WriteError answers with err as a metav1.Status (see writeError).
func WriteError(w http.ResponseWriter, err error) { writeError(w, err) }

// NameSandbox returns w for a request about the Sandbox name: the errors
// written to it name the Sandbox in the Status's details. ResponseController
// reaches w through it.
func NameSandbox(w http.ResponseWriter, name string) http.ResponseWriter {
	return &namedWriter{ResponseWriter: w, name: name}
}

type namedWriter struct {
	http.ResponseWriter
	name string
}

func (w *namedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Status is the metav1.Status that WriteError would answer err with, for
// the Sandbox name: for streams that already began, which end with it.
func Status(name string, err error) *metav1.Status {
	var e *apiError
	if !errors.As(err, &e) {
		e = classify(err)
	}
	st := wire.FailureStatus(int32(e.code), e.reason, name, e.message, e.causes...)
	if e.retryAfter > 0 {
		st.Details.RetryAfterSeconds = int32((e.retryAfter + time.Second - 1) / time.Second)
	}
	return st
}

// ParseRoute parses a subresource path below prefix; a path that names no
// route is an error for WriteError.
func ParseRoute(prefix string, r *http.Request) (wire.Route, error) {
	rt, err := wire.ParseRoute(prefix, r)
	if err != nil {
		return rt, routeError(err)
	}
	return rt, nil
}

// streamStatus is the terminal Status of a stream that failed after its
// response began: err's reason, the cause wire.CauseStreamFailed, and msg
// (when not empty) as its message.
func streamStatus(name string, err error, msg string) *metav1.Status {
	st := Status(name, err)
	st.Details.Causes = append(st.Details.Causes, metav1.StatusCause{Type: wire.CauseStreamFailed})
	if msg != "" {
		st.Message = msg
	}
	return st
}

// writeError answers with err as a metav1.Status. Errors that are not
// *apiError are classified by classify first.
func writeError(w http.ResponseWriter, err error) {
	var name string
	if nw, ok := w.(*namedWriter); ok {
		name = nw.name
	}
	status := Status(name, err)
	if secs := status.Details.RetryAfterSeconds; secs > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(secs)))
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	// A declared trailer must not dangle on an error answer.
	h.Del("Trailer")
	w.WriteHeader(int(status.Code))
	_ = json.NewEncoder(w).Encode(status)
}

// classify maps the errors of execio and dockerruntime to HTTP answers. The
// message always keeps the original text, which names the offending value.
func classify(err error) *apiError {
	switch {
	case errors.Is(err, execio.ErrInvalidPath):
		return badRequest("%v", err).because(wire.CauseInvalidPath, "path")
	case errors.Is(err, execio.ErrInvalidRequest),
		errors.Is(err, execio.ErrUnsupportedEntry):
		return badRequest("%v", err)
	case errors.Is(err, execio.ErrPathNotFound):
		return notFound("%v", err).because(wire.CausePathNotFound, "path")
	case errors.Is(err, execio.ErrTooLarge):
		return tooLarge("%v", err)
	case errors.Is(err, dockerruntime.ErrUnavailable):
		return unavailable(err)
	case errors.Is(err, dockerruntime.ErrNotFound):
		return conflict("the sandbox's container is gone: %v", err).because(wire.CauseContainerNotRunning, "")
	case errors.Is(err, dockerruntime.ErrPaused):
		return conflict("the sandbox is paused; set spec.paused to false to resume it: %v", err).because(wire.CauseSandboxPaused, "")
	case errors.Is(err, context.Canceled):
		// The caller went away; nobody reads this answer.
		return newError(http.StatusRequestTimeout, metav1.StatusReasonTimeout, "request canceled: %v", err)
	case errors.Is(err, context.DeadlineExceeded):
		return newError(http.StatusGatewayTimeout, metav1.StatusReasonTimeout, "%v", err)
	}
	var maxBytes *http.MaxBytesError
	if errors.As(err, &maxBytes) {
		return tooLarge("request body exceeds %d bytes", maxBytes.Limit)
	}
	return newError(http.StatusInternalServerError, metav1.StatusReasonInternalError, "%v", err)
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
