package kubebackend

import (
	"context"
	"errors"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/accessreview"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// permission is one RBAC check: a verb on sandboxes or one of their
// subresources.
type permission = accessreview.Permission

// The permissions each Backend operation needs, as the node API and the API
// server would check them had the caller acted directly.
var (
	permCreate   = permission{Verb: "create"}
	permGet      = permission{Verb: "get"}
	permList     = permission{Verb: "list"}
	permDelete   = permission{Verb: "delete"}
	permExec     = permission{Verb: "create", Subresource: "exec"}
	permUpload   = permission{Verb: "create", Subresource: "files"}
	permDownload = permission{Verb: "get", Subresource: "files"}
	permLogs     = permission{Verb: "get", Subresource: "log"}
	// expose_port and unexpose_port: the caller could forward the port itself.
	permPortForward = permission{Verb: "create", Subresource: "portforward"}
)

// AccessReviewer is the part of the Kubernetes API the authorizer uses;
// tests substitute it.
type AccessReviewer = accessreview.Reviewer

// authorizer asks the API server whether a Kubernetes caller may do what a
// tool is about to do in the namespace (accessreview.Authorizer, shared with
// the docker backend's gate), and words a refusal as a tool error.
type authorizer struct {
	reviews *accessreview.Authorizer
}

func newAuthorizer(r AccessReviewer) *authorizer {
	return &authorizer{reviews: accessreview.New(r)}
}

// forbiddenError is a denied review. It counts as ErrInvalid (the tool
// reports its message as it is) and says which permission is missing.
type forbiddenError struct{ msg string }

func (e *forbiddenError) Error() string { return e.msg }

func (e *forbiddenError) Is(target error) bool { return target == contract.ErrInvalid }

// check returns nil when caller may do p on name in namespace, a *forbiddenError when
// RBAC says no, and ErrUnavailable when the API server cannot say. Callers
// that are not Kubernetes identities are not reviewed: the server's own
// RBAC is all that applies to them.
func (a *authorizer) check(ctx context.Context, caller contract.Caller, namespace string, p permission, name string) error {
	if !caller.IsKubernetesUser() {
		return nil
	}
	err := a.reviews.Check(ctx, caller, namespace, p, name)
	var denied *accessreview.DeniedError
	if errors.As(err, &denied) {
		return &forbiddenError{msg: denied.Error() + "; ask a cluster administrator for this permission (RBAC), for example a RoleBinding to the sandbox exec or editor ClusterRole"}
	}
	return err
}
