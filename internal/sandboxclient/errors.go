package sandboxclient

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
)

// APIError is a refusal by the API server, the operator's aggregated API
// server or the node API behind it, decoded from its metav1.Status.
type APIError struct {
	Namespace, Name string
	// Code is the HTTP status code (401, 403, 404, 409, 413, 429, 503…).
	Code int32
	// Reason is the Status reason, e.g. Forbidden or NotFound.
	Reason metav1.StatusReason
	// Message is the server's explanation.
	Message string
	// Details are the Status's details: the Sandbox's name, group and
	// kind, and the causes (subresource.Cause*) that say precisely why; nil when
	// the server sent none.
	Details *metav1.StatusDetails
	// Source says who refused: "kube-apiserver" (reading the Sandbox),
	// "sandbox API" (its subresources, answered by the API server, the
	// aggregated API server or the node behind them), or "client" when the
	// client decided without an answer (the API server is unreachable, a
	// name is invalid); Code then says which kind of failure it is.
	Source string

	// err is the underlying transport error for a server that could not
	// be reached (Code 503 without a server response).
	err error
}

func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = strings.ToLower(http.StatusText(int(e.Code)))
	}
	// The servers' messages usually name the Sandbox already.
	subject := fmt.Sprintf("sandbox %s/%s", e.Namespace, e.Name)
	if !strings.HasPrefix(msg, subject) {
		msg = subject + ": " + msg
	}
	if e.Source == SourceClient {
		// Decided locally: no server answered with this code.
		return msg
	}
	return fmt.Sprintf("%s (%s, HTTP %d)", msg, e.Source, e.Code)
}

func (e *APIError) Unwrap() error { return e.err }

// Status makes *APIError an apierrors.APIStatus, so that apimachinery's
// helpers (apierrors.ReasonForError, apierrors.IsNotFound, …) work on it
// and on errors that wrap it.
func (e *APIError) Status() metav1.Status {
	return metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Code: e.Code, Reason: e.Reason, Message: e.Message, Details: e.Details,
	}
}

// NotReadyError says the Sandbox exists but cannot run commands: its Ready
// condition is not True (or it is being deleted). Reason and Message are the
// Ready condition's.
type NotReadyError struct {
	Namespace, Name string
	Reason, Message string
}

func (e *NotReadyError) Error() string {
	switch {
	case e.Reason == "" && e.Message == "":
		return fmt.Sprintf("sandbox %s/%s is not ready: no manager has reported on it yet", e.Namespace, e.Name)
	case e.Message == "":
		return fmt.Sprintf("sandbox %s/%s is not ready: %s", e.Namespace, e.Name, e.Reason)
	default:
		return fmt.Sprintf("sandbox %s/%s is not ready: %s: %s", e.Namespace, e.Name, e.Reason, e.Message)
	}
}

// Status makes *NotReadyError an apierrors.APIStatus: a Conflict with the
// cause subresource.CauseSandboxNotReady (subresource.CauseSandboxTerminating while it is
// being deleted, subresource.CauseSandboxPaused while it is paused), as the servers
// answer.
func (e *NotReadyError) Status() metav1.Status {
	cause := subresource.CauseSandboxNotReady
	switch e.Reason {
	case sandboxv1alpha1.SandboxReasonTerminating:
		cause = subresource.CauseSandboxTerminating
	case sandboxv1alpha1.SandboxReasonPaused:
		cause = subresource.CauseSandboxPaused
	}
	return *subresource.FailureStatus(http.StatusConflict, metav1.StatusReasonConflict, e.Name, e.Error(), metav1.StatusCause{Type: cause})
}

// ExecError is a command that the node API started but could not run to
// completion (Docker went away mid-way, …): the exec stream ended with an
// error frame instead of a result.
type ExecError struct {
	Namespace, Name string
	Message         string
	// Reason is the terminal frame's Status reason (ServiceUnavailable,
	// Timeout, InternalError, …); InternalError when it carried none.
	Reason metav1.StatusReason
}

func (e *ExecError) Error() string {
	return fmt.Sprintf("sandbox %s/%s: exec failed: %s", e.Namespace, e.Name, e.Message)
}

// Status makes *ExecError an apierrors.APIStatus (cause
// subresource.CauseStreamFailed).
func (e *ExecError) Status() metav1.Status {
	return streamFailure(e.Name, e.Reason, e.Message)
}

// TransferError is a download, or a log stream, that failed after it began
// streaming; the node API reports it in the Sandbox-Transfer-Error and
// Sandbox-Transfer-Error-Reason trailers. Whatever the writer received is
// incomplete.
type TransferError struct {
	Namespace, Name, Path string
	Message               string
	// Reason is the trailer's Status reason, e.g. RequestEntityTooLarge
	// for the size cap; InternalError when none was sent.
	Reason metav1.StatusReason
}

func (e *TransferError) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("sandbox %s/%s: the stream failed part-way: %s", e.Namespace, e.Name, e.Message)
	}
	return fmt.Sprintf("sandbox %s/%s: download of %s failed part-way: %s", e.Namespace, e.Name, e.Path, e.Message)
}

// Status makes *TransferError an apierrors.APIStatus (cause
// subresource.CauseStreamFailed).
func (e *TransferError) Status() metav1.Status {
	return streamFailure(e.Name, e.Reason, e.Message)
}

// streamFailure is the Status of a stream that failed after it began.
func streamFailure(name string, reason metav1.StatusReason, msg string) metav1.Status {
	if reason == "" {
		reason = metav1.StatusReasonInternalError
	}
	return *subresource.FailureStatus(int32(codeForReason(reason)), reason, name, msg, metav1.StatusCause{Type: subresource.CauseStreamFailed})
}

// StatusOf returns the metav1.Status behind err (an *APIError, *ExecError
// or *TransferError, or any apierrors.APIStatus, however wrapped), or nil.
func StatusOf(err error) *metav1.Status {
	var st apierrors.APIStatus
	if err == nil || !errors.As(err, &st) {
		return nil
	}
	s := st.Status()
	return &s
}

// HasCause reports whether err's Status carries the cause t (a
// subresource.Cause*).
func HasCause(err error, t metav1.CauseType) bool { return subresource.HasCause(StatusOf(err), t) }

func apiCode(err error) int32 {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Code
	}
	return 0
}

// IsUnauthorized: the credentials were missing, invalid or expired (401).
func IsUnauthorized(err error) bool { return apiCode(err) == http.StatusUnauthorized }

// IsForbidden: the caller may not do this to the Sandbox (403).
func IsForbidden(err error) bool { return apiCode(err) == http.StatusForbidden }

// IsNotFound: the Sandbox, or the path inside it, does not exist (404).
func IsNotFound(err error) bool { return apiCode(err) == http.StatusNotFound }

// IsBadRequest: the request was malformed, e.g. an invalid path or an empty
// command (400).
func IsBadRequest(err error) bool { return apiCode(err) == http.StatusBadRequest }

// IsConflict: the node API refused because of the Sandbox's state (409):
// it is not Ready, being deleted, or its container is gone or stopped. Such
// errors are also IsNotReady.
func IsConflict(err error) bool { return apiCode(err) == http.StatusConflict }

// IsTooLarge: an upload, a download or the stdin exceeded its cap (413), or
// a download was cut off by its cap.
func IsTooLarge(err error) bool {
	return apiCode(err) == http.StatusRequestEntityTooLarge || apierrors.IsRequestEntityTooLargeError(err)
}

// IsTooManyRequests: the node API is rate-limiting the caller (429).
func IsTooManyRequests(err error) bool { return apiCode(err) == http.StatusTooManyRequests }

// IsUnavailable: the node API or its Docker Engine is down, or the Sandbox
// has no node API endpoint yet (503). Worth retrying later.
func IsUnavailable(err error) bool { return apiCode(err) == http.StatusServiceUnavailable }

// IsSandboxNotReady: the Sandbox exists but cannot take commands or files,
// either as its status says (*NotReadyError) or as the aggregated API server
// or the node API found it: a Conflict with the cause
// subresource.CauseSandboxNotReady, CauseSandboxTerminating, CauseSandboxPaused or
// CauseContainerNotRunning (or a 409 of the subresources with no cause).
func IsSandboxNotReady(err error) bool {
	var nr *NotReadyError
	if errors.As(err, &nr) {
		return true
	}
	if HasCause(err, subresource.CauseSandboxNotReady) || HasCause(err, subresource.CauseSandboxTerminating) ||
		HasCause(err, subresource.CauseSandboxPaused) || HasCause(err, subresource.CauseContainerNotRunning) {
		return true
	}
	var ae *APIError
	return errors.As(err, &ae) && ae.Source == SourceSubresources && ae.Code == http.StatusConflict
}

// IsSandboxPaused: the Sandbox is paused (spec.paused), as its status says
// or as a server found it (a Conflict with the cause subresource.CauseSandboxPaused).
// Setting spec.paused to false resumes it. Such errors also satisfy
// IsSandboxNotReady.
func IsSandboxPaused(err error) bool {
	var nr *NotReadyError
	if errors.As(err, &nr) && nr.Reason == sandboxv1alpha1.SandboxReasonPaused {
		return true
	}
	return HasCause(err, subresource.CauseSandboxPaused)
}

// IsNotReady is IsSandboxNotReady.
func IsNotReady(err error) bool { return IsSandboxNotReady(err) }

// IsPathNotFound: the path inside the Sandbox does not exist (404 with the
// cause subresource.CausePathNotFound); the Sandbox does.
func IsPathNotFound(err error) bool { return HasCause(err, subresource.CausePathNotFound) }

// IsSandboxGone: the Sandbox does not exist (404, not about a path inside
// it or an unknown endpoint).
func IsSandboxGone(err error) bool {
	return IsNotFound(err) && !IsPathNotFound(err) && !HasCause(err, subresource.CauseNoSuchEndpoint)
}

// IsExecLimit: the Sandbox or its node runs as many commands and transfers
// as it allows (429, cause subresource.CauseExecLimit); retry later.
func IsExecLimit(err error) bool { return HasCause(err, subresource.CauseExecLimit) }

// Values of APIError.Source.
const (
	// SourceAPIServer: kube-apiserver about the Sandbox object itself (a
	// caller that reads it, such as the MCP kubernetes backend, says so;
	// this client never reads it).
	SourceAPIServer = "kube-apiserver"
	// SourceSubresources: the exec, files, log and history subresources,
	// answered by the API server, the aggregated API server or the node.
	SourceSubresources = "sandbox API"
	// SourceClient: decided by the client without an answer.
	SourceClient = "client"
)

// maxErrorBody bounds how much of an error response is read: a Status is
// small, and a misbehaving server must not make the client buffer much.
const maxErrorBody = 64 << 10

// decodeErrorResponse turns a non-2xx subresource response into an *APIError,
// using the metav1.Status body when there is one and the status line
// otherwise.
func decodeErrorResponse(ns, name string, resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	ae := &APIError{Namespace: ns, Name: name, Code: int32(resp.StatusCode), Source: SourceSubresources}
	var st metav1.Status
	if err := json.Unmarshal(body, &st); err == nil && (st.Kind == "Status" || st.Message != "" || st.Reason != "") {
		ae.Reason = st.Reason
		ae.Message = st.Message
		ae.Details = st.Details
		if st.Code != 0 && st.Code != ae.Code {
			// The HTTP status is what proxies and retries act on; the body's
			// code is only informative.
			ae.Message = fmt.Sprintf("%s (status code %d)", ae.Message, st.Code)
		}
	} else {
		ae.Message = strings.TrimSpace(string(body))
	}
	if ae.Reason == "" {
		ae.Reason = reasonForCode(resp.StatusCode)
	}
	return ae
}

// codeForReason is the HTTP code that goes with a standard reason.
func codeForReason(reason metav1.StatusReason) int {
	for _, code := range []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound,
		http.StatusConflict, http.StatusRequestEntityTooLarge, http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		if reasonForCode(code) == reason {
			return code
		}
	}
	switch reason {
	case metav1.StatusReasonTimeout:
		return http.StatusGatewayTimeout
	case metav1.StatusReasonInvalid:
		return http.StatusUnprocessableEntity
	}
	return http.StatusInternalServerError
}

func reasonForCode(code int) metav1.StatusReason {
	switch code {
	case http.StatusBadRequest:
		return metav1.StatusReasonBadRequest
	case http.StatusUnauthorized:
		return metav1.StatusReasonUnauthorized
	case http.StatusForbidden:
		return metav1.StatusReasonForbidden
	case http.StatusNotFound:
		return metav1.StatusReasonNotFound
	case http.StatusConflict:
		return metav1.StatusReasonConflict
	case http.StatusRequestEntityTooLarge:
		return metav1.StatusReasonRequestEntityTooLarge
	case http.StatusTooManyRequests:
		return metav1.StatusReasonTooManyRequests
	case http.StatusServiceUnavailable:
		return metav1.StatusReasonServiceUnavailable
	case http.StatusUnprocessableEntity:
		return metav1.StatusReasonInvalid
	case http.StatusRequestTimeout, http.StatusGatewayTimeout:
		return metav1.StatusReasonTimeout
	case http.StatusInternalServerError:
		return metav1.StatusReasonInternalError
	}
	return metav1.StatusReasonUnknown
}
