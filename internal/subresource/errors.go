/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package subresource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Error is a refusal that the servers answer with a metav1.Status, as the
// API server answers, so that clients can reuse apimachinery's error
// helpers (apierrors.FromObject and friends) on the body. Its causes say
// precisely why (the Cause* constants).
type Error struct {
	Code    int
	Reason  metav1.StatusReason
	Message string
	// Causes become details.causes.
	Causes []metav1.StatusCause
	// RetryAfter, when set, becomes details.retryAfterSeconds and a
	// Retry-After header.
	RetryAfter time.Duration
}

func (e *Error) Error() string { return e.Message }

// NewError is a failure answered with code and reason.
func NewError(code int, reason metav1.StatusReason, format string, args ...any) *Error {
	return &Error{Code: code, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// Because adds a cause (a Cause* constant) about field (may be empty).
func (e *Error) Because(t metav1.CauseType, field string) *Error {
	e.Causes = append(e.Causes, metav1.StatusCause{Type: t, Field: field})
	return e
}

// Status is e as the metav1.Status about the Sandbox name (may be empty).
func (e *Error) Status(name string) *metav1.Status {
	st := FailureStatus(int32(e.Code), e.Reason, name, e.Message, e.Causes...)
	if e.RetryAfter > 0 {
		st.Details.RetryAfterSeconds = int32((e.RetryAfter + time.Second - 1) / time.Second)
	}
	return st
}

// Conflict is a 409: the Sandbox exists but is in no state for the request.
func Conflict(t metav1.CauseType, format string, args ...any) *Error {
	return NewError(http.StatusConflict, metav1.StatusReasonConflict, format, args...).Because(t, "")
}

// AsError is err as an *Error: itself if it is one, else by what it wraps
// that every server meets (the caller going away, a deadline, an oversized
// body), else an InternalError. The message keeps err's text.
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	var maxBytes *http.MaxBytesError
	switch {
	case errors.Is(err, context.Canceled):
		// The caller went away; nobody reads this answer.
		return NewError(http.StatusRequestTimeout, metav1.StatusReasonTimeout, "request canceled: %v", err)
	case errors.Is(err, context.DeadlineExceeded):
		return NewError(http.StatusGatewayTimeout, metav1.StatusReasonTimeout, "%v", err)
	case errors.As(err, &maxBytes):
		return NewError(http.StatusRequestEntityTooLarge, metav1.StatusReasonRequestEntityTooLarge, "request body exceeds %d bytes", maxBytes.Limit)
	}
	return NewError(http.StatusInternalServerError, metav1.StatusReasonInternalError, "%v", err)
}

// WriteError answers with err (AsError) as a metav1.Status about the
// Sandbox that NameSandbox gave w, if any.
func WriteError(w http.ResponseWriter, err error) {
	WriteStatus(w, AsError(err).Status(SandboxName(w)))
}

// WriteStatus answers with status: its code, a Retry-After header when it
// says when to retry, and the Status as JSON.
func WriteStatus(w http.ResponseWriter, status *metav1.Status) {
	h := w.Header()
	if status.Details != nil && status.Details.RetryAfterSeconds > 0 {
		h.Set("Retry-After", strconv.Itoa(int(status.Details.RetryAfterSeconds)))
	}
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	// A declared trailer must not dangle on an error answer.
	h.Del("Trailer")
	w.WriteHeader(int(status.Code))
	_ = json.NewEncoder(w).Encode(status)
}

// NameSandbox returns w for a request about the Sandbox name: the errors
// WriteError writes to it name the Sandbox in the Status's details.
// http.ResponseController reaches w through it.
func NameSandbox(w http.ResponseWriter, name string) http.ResponseWriter {
	return &namedWriter{ResponseWriter: w, name: name}
}

// SandboxName is the name NameSandbox gave w, or "".
func SandboxName(w http.ResponseWriter) string {
	if nw, ok := w.(*namedWriter); ok {
		return nw.name
	}
	return ""
}

type namedWriter struct {
	http.ResponseWriter
	name string
}

func (w *namedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
