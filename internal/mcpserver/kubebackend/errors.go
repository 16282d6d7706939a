package kubebackend

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/execio"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
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
	sandboxv1alpha1.SandboxReasonImageNotFound:           contract.ErrImageNotFound,
	sandboxv1alpha1.SandboxReasonImageRegistryNotAllowed: contract.ErrInvalid,
	sandboxv1alpha1.SandboxReasonRuntimeUnavailable:      contract.ErrUnavailable,
	sandboxv1alpha1.SandboxReasonCreateFailed:            contract.ErrInvalid,
	sandboxv1alpha1.SandboxReasonContainerExited:         contract.ErrInvalid,
	sandboxv1alpha1.SandboxReasonOOMKilled:               contract.ErrInvalid,
	sandboxv1alpha1.SandboxReasonMultipleContainers:      contract.ErrInvalid,
	sandboxv1alpha1.SandboxReasonExpired:                 contract.ErrInvalid,
	sandboxv1alpha1.SandboxReasonTerminating:             contract.ErrInvalid,
	sandboxv1alpha1.SandboxReasonWarmPoolMemberInvalid:   contract.ErrInvalid,
	// Its node is gone for good (docs/node-loss.md); exec and files on it
	// fail with ErrNotRunning naming NodeLost (clientError).
	sandboxv1alpha1.SandboxReasonNodeLost: contract.ErrUnavailable,
}

// startStatus reads a Sandbox's status for a create that waits on it. For
// starting it returns a description of why it is not Ready yet (the last one
// is reported if the wait times out); for failed the error to return, which
// names the reason and carries the manager's message.
func startStatus(sbx *sandboxv1alpha1.Sandbox) (startState, error) {
	if sbx.DeletionTimestamp != nil {
		return failed, &messageError{kind: contract.ErrInvalid, msg: fmt.Sprintf("sandbox %s was deleted while it was starting", sbx.Name)}
	}
	if c := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1alpha1.SandboxConditionExpired)); c != nil && c.Status == metav1.ConditionTrue {
		return failed, conditionError(sbx.Name, contract.ErrInvalid, sandboxv1alpha1.SandboxReasonExpired, c.Message)
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

// apiError maps an API server error onto the Backend's errors by its Status
// reason and causes, keeping the API server's message: a refusal by RBAC,
// an admission webhook (the quota webhook) or CRD validation is something
// the model can act on.
func apiError(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: %s: %w", contract.ErrNotFound, what, err)
	case apierrors.IsForbidden(err):
		return refusedError(what, err)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsAlreadyExists(err), apierrors.IsConflict(err):
		return &messageError{kind: contract.ErrInvalid, msg: fmt.Sprintf("%s: the API server refused: %s", what, statusMessage(err))}
	case apierrors.IsServiceUnavailable(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		apierrors.IsTooManyRequests(err), apierrors.IsUnexpectedServerError(err), apierrors.IsInternalError(err):
		return fmt.Errorf("%w: %s: %w", contract.ErrUnavailable, what, err)
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		// An admission webhook that failed (rather than refused) answers
		// with a 5xx status, for example the quota webhook when it could
		// not record usage: worth a retry.
		if st.Status().Code >= http.StatusInternalServerError {
			return &messageError{kind: contract.ErrUnavailable, msg: fmt.Sprintf("%s: %s", what, statusMessage(err))}
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	// No answer at all: the connection failed.
	return fmt.Errorf("%w: %s: the API server did not answer: %w", contract.ErrUnavailable, what, err)
}

// refusedError classifies a 403 from the API server by the causes the
// SandboxQuota webhook puts in its Status (subresource.CauseQuota*), which
// kube-apiserver passes on. Every case keeps the API server's message,
// which names the limit and by how much it is exceeded, or which rule
// refused and what is allowed instead. Any other 403 (RBAC, or the built-in
// ResourceQuota admission, whose Status carries no cause) is a refusal the
// model can only read.
func refusedError(what string, err error) error {
	msg := statusMessage(err)
	st := sandboxclient.StatusOf(err)
	switch {
	case subresource.HasCause(st, subresource.CauseQuotaRule):
		// Checked first: stopping sandboxes would not help; asking for
		// something else does.
		for _, c := range st.Details.Causes {
			if c.Type == subresource.CauseQuotaRule && c.Field == "spec.activeDeadlineSeconds" {
				msg += " (a sandbox's lifetime is its activeDeadlineSeconds: ask for a shorter one)"
				break
			}
		}
		return &messageError{kind: contract.ErrInvalid, msg: fmt.Sprintf("%s: the API server refused: %s", what, msg)}
	case subresource.HasCause(st, subresource.CauseQuotaNotCounted):
		return &messageError{kind: contract.ErrUnavailable, msg: fmt.Sprintf("%s: %s", what, msg)}
	case subresource.HasCause(st, subresource.CauseQuotaExceeded):
		return &messageError{kind: contract.ErrQuota, msg: fmt.Sprintf("%s: %s", what, msg)}
	}
	return &messageError{kind: contract.ErrInvalid, msg: fmt.Sprintf("%s: the API server refused: %s", what, msg)}
}

func statusMessage(err error) string {
	if st := sandboxclient.StatusOf(err); st != nil && st.Message != "" {
		return st.Message
	}
	return err.Error()
}

// clientError maps a sandboxclient error onto the Backend's errors by its
// Status reason and causes (subresource.Cause*).
func clientError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case sandboxclient.IsSandboxNotReady(err):
		return fmt.Errorf("%w: %w", contract.ErrNotRunning, err)
	case sandboxclient.IsTooLarge(err):
		return fmt.Errorf("%w: %w", execio.ErrTooLarge, err)
	case sandboxclient.IsPathNotFound(err):
		return &messageError{kind: execio.ErrPathNotFound, msg: execio.ErrPathNotFound.Error() + ": " + statusMessage(err)}
	}
	switch apierrors.ReasonForError(err) {
	case metav1.StatusReasonNotFound:
		return fmt.Errorf("%w: %w", contract.ErrNotFound, err)
	case metav1.StatusReasonConflict:
		return fmt.Errorf("%w: %w", contract.ErrNotRunning, err)
	case metav1.StatusReasonBadRequest, metav1.StatusReasonInvalid:
		return &messageError{kind: contract.ErrInvalid, msg: statusMessage(err)}
	case metav1.StatusReasonServiceUnavailable, metav1.StatusReasonTooManyRequests, metav1.StatusReasonTimeout:
		return fmt.Errorf("%w: %w", contract.ErrUnavailable, err)
	case metav1.StatusReasonUnauthorized, metav1.StatusReasonForbidden:
		return fmt.Errorf("the MCP server's own credentials were refused (check its RBAC: sandboxes/exec, sandboxes/files, sandboxes/log): %w", err)
	}
	return err
}
