package kubebackend

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
)

// messageError carries a message meant for the model as it is, and counts
// as kind for errors.Is, so that tools add the advice that goes with kind
// without the sentinel's own text prefixed.
type messageError struct {
	kind error
	msg  string
}

func (e *messageError) Error() string { return e.msg }

func (e *messageError) Is(target error) bool { return target == e.kind }

// startState is what a Sandbox's status says about a create waiting for it.
type startState int

const (
	// starting: not Ready yet, and it may still become Ready.
	starting startState = iota
	// started: Ready, with a node API to run commands through.
	started
	// failed: it reached a state it will not leave by itself.
	failed
)

// terminalReasons are Ready reasons after which waiting is pointless: the
// manager retries some of them (ImageNotFound, CreateFailed), but not in a
// way that helps a model waiting for its sandbox.
var terminalReasons = map[string]error{
	sandboxv1alpha1.SandboxReasonImageNotFound:      mcpserver.ErrImageNotFound,
	sandboxv1alpha1.SandboxReasonRuntimeUnavailable: mcpserver.ErrUnavailable,
	sandboxv1alpha1.SandboxReasonCreateFailed:       mcpserver.ErrInvalid,
	sandboxv1alpha1.SandboxReasonContainerExited:    mcpserver.ErrInvalid,
	sandboxv1alpha1.SandboxReasonOOMKilled:          mcpserver.ErrInvalid,
	sandboxv1alpha1.SandboxReasonMultipleContainers: mcpserver.ErrInvalid,
	sandboxv1alpha1.SandboxReasonExpired:            mcpserver.ErrInvalid,
	sandboxv1alpha1.SandboxReasonTerminating:        mcpserver.ErrInvalid,
}

// startStatus reads a Sandbox's status for a create that waits on it. For
// starting it returns a description of why it is not Ready yet (the last one
// is reported if the wait times out); for failed the error to return, which
// names the reason and carries the manager's message.
func startStatus(sbx *sandboxv1alpha1.Sandbox) (startState, error) {
	if sbx.DeletionTimestamp != nil {
		return failed, &messageError{kind: mcpserver.ErrInvalid, msg: fmt.Sprintf("sandbox %s was deleted while it was starting", sbx.Name)}
	}
	if c := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionExpired)); c != nil && c.Status == metav1.ConditionTrue {
		return failed, conditionError(sbx.Name, mcpserver.ErrInvalid, sandboxv1alpha1.SandboxReasonExpired, c.Message)
	}
	ready := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
	switch {
	case ready == nil:
		return starting, errors.New("no manager has picked it up yet (is a manager running with spare capacity?)")
	case ready.Status == metav1.ConditionTrue && sbx.Status.NodeAPIEndpoint == "":
		return starting, fmt.Errorf("it runs on node %q, whose manager has not published its node API yet", sbx.Status.NodeName)
	case ready.Status == metav1.ConditionTrue:
		return started, nil
	}
	if kind, ok := terminalReasons[ready.Reason]; ok {
		return failed, conditionError(sbx.Name, kind, ready.Reason, ready.Message)
	}
	// Pending, NodeAtCapacity, Provisioning, DockerUnavailable,
	// ContainerMissing and reasons a newer manager may add: keep waiting.
	return starting, fmt.Errorf("%s: %s", ready.Reason, ready.Message)
}

func conditionError(name string, kind error, reason, message string) error {
	msg := fmt.Sprintf("sandbox %s failed to start: %s", name, reason)
	if message != "" {
		msg += ": " + message
	}
	return &messageError{kind: kind, msg: msg + " (the Sandbox was deleted)"}
}

// apiError maps an API server error onto the Backend's errors, keeping the
// API server's message: a refusal by RBAC, an admission webhook (the quota
// webhook) or CRD validation is something the model can act on.
func apiError(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: %s: %w", mcpserver.ErrNotFound, what, err)
	case apierrors.IsForbidden(err):
		return refusedError(what, statusMessage(err))
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsAlreadyExists(err), apierrors.IsConflict(err):
		return &messageError{kind: mcpserver.ErrInvalid, msg: fmt.Sprintf("%s: the API server refused: %s", what, statusMessage(err))}
	case apierrors.IsServiceUnavailable(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		apierrors.IsTooManyRequests(err), apierrors.IsUnexpectedServerError(err), apierrors.IsInternalError(err):
		return fmt.Errorf("%w: %s: %w", mcpserver.ErrUnavailable, what, err)
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		// An admission webhook that failed (rather than refused) answers
		// with a 5xx status and no reason, for example the quota webhook
		// when it could not record usage: worth a retry.
		if st.Status().Code >= http.StatusInternalServerError {
			return &messageError{kind: mcpserver.ErrUnavailable, msg: fmt.Sprintf("%s: %s", what, statusMessage(err))}
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	// No answer at all: the connection failed.
	return fmt.Errorf("%w: %s: the API server did not answer: %w", mcpserver.ErrUnavailable, what, err)
}

// The SandboxQuota webhook's refusals (internal/quota, internal/admission),
// as the API server passes them on after `admission webhook "…" denied the
// request: `. The quota's name is quoted, so nothing in it can fake the
// words after it.
var (
	// A rule of the quota forbids the Sandbox as asked: another image,
	// runtime, network mode or lifetime would be admitted.
	sandboxQuotaRuleRE = regexp.MustCompile(`sandbox quota "[^"]*" (does not allow |requires spec\.activeDeadlineSeconds|allows activeDeadlineSeconds )`)
	// The quota's usage was never counted; it will be in a few seconds.
	sandboxQuotaUncountedRE = regexp.MustCompile(`sandbox quota "[^"]*" has not counted its usage yet`)
	// The quota is used up: `sandbox quota "team-a" exceeded: sandboxes:
	// requested 1, used 3, limit 3 (1 over)`.
	sandboxQuotaExceededRE = regexp.MustCompile(`sandbox quota "[^"]*" exceeded: `)
)

// refusedError classifies a 403 from the API server: RBAC, the built-in
// ResourceQuota admission, or the SandboxQuota webhook. Every case keeps
// the API server's message, which names the limit and by how much it is
// exceeded, or which rule refused and what is allowed instead.
func refusedError(what, msg string) error {
	lower := strings.ToLower(msg)
	switch {
	case sandboxQuotaRuleRE.MatchString(msg):
		// Checked first: the refused image may itself contain "exceeded"
		// or "quota". Stopping sandboxes would not help; asking for
		// something else does.
		if strings.Contains(msg, "activeDeadlineSeconds") {
			msg += " (a sandbox's lifetime is its activeDeadlineSeconds: ask for a shorter one)"
		}
		return &messageError{kind: mcpserver.ErrInvalid, msg: fmt.Sprintf("%s: the API server refused: %s", what, msg)}
	case sandboxQuotaUncountedRE.MatchString(msg),
		// ResourceQuota's counterpart: `status unknown for quota: q, …`.
		strings.Contains(lower, "status unknown for quota"):
		return &messageError{kind: mcpserver.ErrUnavailable, msg: fmt.Sprintf("%s: %s", what, msg)}
	case sandboxQuotaExceededRE.MatchString(msg),
		// ResourceQuota (count/sandboxes.sandbox.code-sandbox.dev):
		// `exceeded quota: q, requested: …, used: …, limited: …`.
		strings.Contains(lower, "exceeded") && strings.Contains(lower, "quota"):
		return &messageError{kind: mcpserver.ErrQuota, msg: fmt.Sprintf("%s: %s", what, msg)}
	}
	return &messageError{kind: mcpserver.ErrInvalid, msg: fmt.Sprintf("%s: the API server refused: %s", what, msg)}
}

func statusMessage(err error) string {
	var st apierrors.APIStatus
	if errors.As(err, &st) && st.Status().Message != "" {
		return st.Status().Message
	}
	return err.Error()
}

// nodeOp says which node API operation failed, because a 404 means
// different things: no such path for files, no such sandbox otherwise.
type nodeOp int

const (
	opExec nodeOp = iota
	opFiles
	opLogs
)

// clientError maps a sandboxclient error onto the Backend's errors.
func clientError(op nodeOp, err error) error {
	var (
		ae *sandboxclient.APIError
		nr *sandboxclient.NotReadyError
		te *sandboxclient.TransferError
	)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.As(err, &nr):
		return fmt.Errorf("%w: %w", mcpserver.ErrNotRunning, err)
	case sandboxclient.IsTooLarge(err):
		return fmt.Errorf("%w: %w", execio.ErrTooLarge, err)
	case errors.As(err, &te):
		return err
	case !errors.As(err, &ae):
		return err
	}
	switch {
	case ae.Code == http.StatusNotFound && op == opFiles && pathMissing(ae):
		return &messageError{kind: execio.ErrPathNotFound, msg: execio.ErrPathNotFound.Error() + ": " + ae.Message}
	case ae.Code == http.StatusNotFound:
		return fmt.Errorf("%w: %w", mcpserver.ErrNotFound, err)
	case sandboxclient.IsNotReady(err):
		return fmt.Errorf("%w: %w", mcpserver.ErrNotRunning, err)
	case ae.Code == http.StatusBadRequest:
		return &messageError{kind: mcpserver.ErrInvalid, msg: ae.Message}
	case ae.Code == http.StatusServiceUnavailable, ae.Code == http.StatusTooManyRequests, ae.Code == http.StatusGatewayTimeout:
		return fmt.Errorf("%w: %w", mcpserver.ErrUnavailable, err)
	case ae.Code == http.StatusUnauthorized, ae.Code == http.StatusForbidden:
		return fmt.Errorf("the MCP server's own credentials were refused (check its RBAC: sandboxes/exec, sandboxes/files, sandboxes/log): %w", err)
	}
	return err
}

// pathMissing tells a node API 404 about a path inside the Sandbox from one
// about the Sandbox itself ("sandbox NS/NAME not found", "… is not on
// node …") or the endpoint ("no such …"). The client found the Sandbox
// through the API server just before, so on a file transfer it is almost
// always the path.
func pathMissing(ae *sandboxclient.APIError) bool {
	return ae.Source == sandboxclient.SourceSubresources &&
		!strings.HasPrefix(ae.Message, "sandbox "+ae.Namespace+"/") &&
		!strings.HasPrefix(ae.Message, "no such ")
}
