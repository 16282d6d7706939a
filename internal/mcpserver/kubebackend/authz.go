package kubebackend

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver"
)

// Decision cache lifetimes: a revoked RoleBinding takes effect within
// seconds, while a burst of tool calls (an exec per command, a Get before a
// download) costs one review.
const (
	accessReviewTTL     = 10 * time.Second
	accessReviewMax     = 10000
	accessReviewTimeout = 10 * time.Second
)

// permission is one RBAC check: a verb on sandboxes or one of their
// subresources.
type permission struct {
	Verb        string
	Subresource string
}

func (p permission) String() string {
	if p.Subresource == "" {
		return p.Verb + " sandboxes"
	}
	return p.Verb + " sandboxes/" + p.Subresource
}

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
)

// AccessReviewer is the part of the Kubernetes API the authorizer uses;
// tests substitute it.
type AccessReviewer interface {
	Create(ctx context.Context, review *authzv1.SubjectAccessReview, opts metav1.CreateOptions) (*authzv1.SubjectAccessReview, error)
}

// authorizer asks the API server whether a Kubernetes caller may do what a
// tool is about to do in the namespace. The MCP server then acts with its
// own credentials: it never forwards the caller's token and needs no
// impersonate rights, which would make its ServiceAccount as powerful as
// any user it could name.
type authorizer struct {
	reviewer AccessReviewer

	mu    sync.Mutex
	cache map[[sha256.Size]byte]decision
}

type decision struct {
	allowed bool
	reason  string
	expires time.Time
}

func newAuthorizer(r AccessReviewer) *authorizer {
	return &authorizer{reviewer: r, cache: map[[sha256.Size]byte]decision{}}
}

// reviewFor builds the SubjectAccessReview for caller doing p on the
// Sandbox name (empty for create and list).
func reviewFor(caller mcpserver.Caller, namespace string, p permission, name string) *authzv1.SubjectAccessReview {
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User:   caller.Username,
		UID:    caller.UID,
		Groups: slices.Clone(caller.Groups),
		ResourceAttributes: &authzv1.ResourceAttributes{
			Namespace:   namespace,
			Verb:        p.Verb,
			Group:       sandboxv1alpha1.GroupVersion.Group,
			Version:     sandboxv1alpha1.GroupVersion.Version,
			Resource:    "sandboxes",
			Subresource: p.Subresource,
			Name:        name,
		},
	}}
	if len(caller.Extra) > 0 {
		sar.Spec.Extra = make(map[string]authzv1.ExtraValue, len(caller.Extra))
		for k, v := range caller.Extra {
			sar.Spec.Extra[k] = slices.Clone(v)
		}
	}
	return sar
}

// forbiddenError is a denied review. It counts as ErrInvalid (the tool
// reports its message as it is) and says which permission is missing.
type forbiddenError struct{ msg string }

func (e *forbiddenError) Error() string { return e.msg }

func (e *forbiddenError) Is(target error) bool { return target == mcpserver.ErrInvalid }

// check returns nil when caller may do p on name in namespace, a *forbiddenError when
// RBAC says no, and ErrUnavailable when the API server cannot say. Callers
// that are not Kubernetes identities are not reviewed: the server's own
// RBAC is all that applies to them.
func (a *authorizer) check(ctx context.Context, caller mcpserver.Caller, namespace string, p permission, name string) error {
	if !caller.IsKubernetesUser() {
		return nil
	}
	sar := reviewFor(caller, namespace, p, name)
	key, err := cacheKey(sar)
	if err != nil {
		return fmt.Errorf("building the access review cache key: %w", err)
	}
	now := time.Now()
	a.mu.Lock()
	d, ok := a.cache[key]
	a.mu.Unlock()
	if !ok || now.After(d.expires) {
		rctx, cancel := context.WithTimeout(ctx, accessReviewTimeout)
		res, err := a.reviewer.Create(rctx, sar, metav1.CreateOptions{})
		cancel()
		if err != nil {
			if errors.Is(err, context.Canceled) && ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w: SubjectAccessReview for %s failed: %w", mcpserver.ErrUnavailable, caller.Username, err)
		}
		d = decision{allowed: res.Status.Allowed && !res.Status.Denied, reason: res.Status.Reason, expires: now.Add(accessReviewTTL)}
		a.store(key, d, now)
	}
	if d.allowed {
		return nil
	}
	return deniedError(caller.Username, p, namespace, name, d.reason)
}

func deniedError(user string, p permission, namespace, name, reason string) error {
	msg := fmt.Sprintf("user %q may not %s in namespace %q", user, p, namespace)
	if name != "" {
		msg = fmt.Sprintf("user %q may not %s (sandbox %s) in namespace %q", user, p, name, namespace)
	}
	if reason != "" {
		msg += " (" + reason + ")"
	}
	return &forbiddenError{msg: msg + "; ask a cluster administrator for this permission (RBAC), for example a RoleBinding to the sandbox exec or editor ClusterRole"}
}

func (a *authorizer) store(key [sha256.Size]byte, d decision, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.cache) >= accessReviewMax {
		for k, old := range a.cache {
			if now.After(old.expires) {
				delete(a.cache, k)
			}
		}
		if len(a.cache) >= accessReviewMax {
			clear(a.cache)
		}
	}
	a.cache[key] = d
}

// cacheKey digests the whole review spec: user, uid, groups, extra and the
// attributes. encoding/json sorts map keys, so equal specs hash equally.
func cacheKey(sar *authzv1.SubjectAccessReview) ([sha256.Size]byte, error) {
	b, err := json.Marshal(sar.Spec)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	return sha256.Sum256(b), nil
}
