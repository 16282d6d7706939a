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
// (apierrors.FromObject and friends) on the body.
type apiError struct {
	code    int
	reason  metav1.StatusReason
	message string
	// retryAfter, when set, becomes a Retry-After header.
	retryAfter time.Duration
}

func (e *apiError) Error() string { return e.message }

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
	e := newError(http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, format, args...)
	e.retryAfter = time.Second
	return e
}

func unavailable(err error) *apiError {
	e := newError(http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
		"the node's Docker Engine is unavailable; retry later: %v", err)
	e.retryAfter = 5 * time.Second
	return e
}

// routeError turns a path that names no route into its answer.
func routeError(e *wire.RouteError) *apiError {
	reason := metav1.StatusReasonNotFound
	switch e.Code {
	case http.StatusBadRequest:
		reason = metav1.StatusReasonBadRequest
	case http.StatusMethodNotAllowed:
		reason = metav1.StatusReasonMethodNotAllowed
	}
	return newError(e.Code, reason, "%s", e.Message)
}

// NewError is a failure that WriteError answers with code and reason; the
// aggregated API server answers with it too.
func NewError(code int, reason metav1.StatusReason, format string, args ...any) error {
	return newError(code, reason, format, args...)
}

// WriteError answers with err as a metav1.Status (see writeError).
func WriteError(w http.ResponseWriter, err error) { writeError(w, err) }

// ParseRoute parses a subresource path below prefix; a path that names no
// route is an error for WriteError.
func ParseRoute(prefix string, r *http.Request) (wire.Route, error) {
	rt, err := wire.ParseRoute(prefix, r)
	if err != nil {
		return rt, routeError(err)
	}
	return rt, nil
}

// writeError answers with err as a metav1.Status. Errors that are not
// *apiError are classified by classify first.
func writeError(w http.ResponseWriter, err error) {
	var e *apiError
	if !errors.As(err, &e) {
		e = classify(err)
	}
	status := metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Code:     int32(e.code),
		Reason:   e.reason,
		Message:  e.message,
	}
	if e.retryAfter > 0 {
		secs := int((e.retryAfter + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		status.Details = &metav1.StatusDetails{RetryAfterSeconds: int32(secs)}
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	// A declared trailer must not dangle on an error answer.
	h.Del("Trailer")
	w.WriteHeader(e.code)
	_ = json.NewEncoder(w).Encode(&status)
}

// classify maps the errors of execio and dockerruntime to HTTP answers. The
// message always keeps the original text, which names the offending value.
func classify(err error) *apiError {
	switch {
	case errors.Is(err, execio.ErrInvalidRequest),
		errors.Is(err, execio.ErrInvalidPath),
		errors.Is(err, execio.ErrUnsupportedEntry):
		return badRequest("%v", err)
	case errors.Is(err, execio.ErrPathNotFound):
		return notFound("%v", err)
	case errors.Is(err, execio.ErrTooLarge):
		return tooLarge("%v", err)
	case errors.Is(err, dockerruntime.ErrUnavailable):
		return unavailable(err)
	case errors.Is(err, dockerruntime.ErrNotFound):
		return conflict("the sandbox's container is gone: %v", err)
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
