/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

// Package accessreview asks the Kubernetes API server, with a
// SubjectAccessReview, whether an MCP caller (a Kubernetes identity from
// TokenReview) may do something with Sandboxes, and caches the answers.
// The kubernetes backend reviews every operation with it; the docker
// backend under --auth kubernetes admits callers with it (Gate).
package accessreview

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	authzclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/auth"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// Decision cache lifetimes: a revoked RoleBinding takes effect within
// seconds, while a burst of tool calls (an exec per command, a Get before a
// download) costs one review.
const (
	TTL           = 10 * time.Second
	cacheMax      = 10000
	reviewTimeout = 10 * time.Second
)

// Permission is one RBAC check: a verb on sandboxes
// (sandbox.code-sandbox.dev) or one of their subresources, or on another
// resource of that group (Resource: sandboxsnapshots).
type Permission struct {
	Verb        string
	Subresource string
	// Resource is the group's resource (empty: sandboxes).
	Resource string
}

func (p Permission) resource() string {
	if p.Resource == "" {
		return "sandboxes"
	}
	return p.Resource
}

func (p Permission) String() string {
	if p.Subresource == "" {
		return p.Verb + " " + p.resource()
	}
	return p.Verb + " " + p.resource() + "/" + p.Subresource
}

// Reviewer is the part of the Kubernetes API the Authorizer uses; tests
// substitute it.
type Reviewer interface {
	Create(ctx context.Context, review *authzv1.SubjectAccessReview, opts metav1.CreateOptions) (*authzv1.SubjectAccessReview, error)
}

// Authorizer asks the API server whether a Kubernetes caller may do
// something in a namespace. The MCP server then acts with its own
// credentials: it never forwards the caller's token and needs no
// impersonate rights, which would make its ServiceAccount as powerful as any
// user it could name. Decisions, allowed or denied, are cached for TTL, in
// the LRU cache k8s.io/apiserver's webhook authorizer keeps its
// SubjectAccessReview answers in, keyed as it keys them: by the whole spec.
type Authorizer struct {
	reviewer Reviewer
	cache    *cache.LRUExpireCache // cacheKey -> authzv1.SubjectAccessReviewStatus
}

// New returns an Authorizer that reviews through r.
func New(r Reviewer) *Authorizer {
	return &Authorizer{reviewer: r, cache: cache.NewLRUExpireCache(cacheMax)}
}

// NewForConfig returns an Authorizer that reviews through cfg's API server
// (its identity needs create on subjectaccessreviews).
func NewForConfig(cfg *rest.Config) (*Authorizer, error) {
	c, err := authzclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("SubjectAccessReview client: %w", err)
	}
	return New(c.SubjectAccessReviews()), nil
}

// DeniedError is a review the API server answered with no.
type DeniedError struct {
	User       string
	Permission Permission
	Namespace  string
	// Name is the Sandbox reviewed; empty for create and list.
	Name string
	// Reason is the authorizer's reason, often empty.
	Reason string
}

func (e *DeniedError) Error() string {
	msg := fmt.Sprintf("user %q may not %s in namespace %q", e.User, e.Permission, e.Namespace)
	if e.Name != "" {
		msg = fmt.Sprintf("user %q may not %s (sandbox %s) in namespace %q", e.User, e.Permission, e.Name, e.Namespace)
	}
	if e.Reason != "" {
		msg += " (" + e.Reason + ")"
	}
	return msg
}

// ReviewFor builds the SubjectAccessReview for caller doing p on the
// Sandbox name (empty for create and list) in namespace: the user, UID,
// groups and extra of the TokenReview, so the API server decides for
// exactly that user.
func ReviewFor(caller contract.Caller, namespace string, p Permission, name string) *authzv1.SubjectAccessReview {
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User:   caller.Username,
		UID:    caller.UID,
		Groups: slices.Clone(caller.Groups),
		ResourceAttributes: &authzv1.ResourceAttributes{
			Namespace:   namespace,
			Verb:        p.Verb,
			Group:       sandboxv1alpha1.GroupVersion.Group,
			Version:     sandboxv1alpha1.GroupVersion.Version,
			Resource:    p.resource(),
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

// Check returns nil when caller may do p on name in namespace, a
// *DeniedError when RBAC says no, and an error matching
// contract.ErrUnavailable when the API server cannot say. The caller must
// be a Kubernetes identity (Caller.IsKubernetesUser); anyone else is
// denied.
func (a *Authorizer) Check(ctx context.Context, caller contract.Caller, namespace string, p Permission, name string) error {
	if !caller.IsKubernetesUser() {
		return &DeniedError{User: caller.ID, Permission: p, Namespace: namespace, Name: name, Reason: "not a Kubernetes identity"}
	}
	sar := ReviewFor(caller, namespace, p, name)
	key, err := cacheKey(sar)
	if err != nil {
		return fmt.Errorf("building the access review cache key: %w", err)
	}
	cached, ok := a.cache.Get(key)
	st, _ := cached.(authzv1.SubjectAccessReviewStatus)
	if !ok {
		rctx, cancel := context.WithTimeout(ctx, reviewTimeout)
		res, err := a.reviewer.Create(rctx, sar, metav1.CreateOptions{})
		cancel()
		if err != nil {
			if errors.Is(err, context.Canceled) && ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w: SubjectAccessReview for %s failed: %w", contract.ErrUnavailable, caller.Username, err)
		}
		st = res.Status
		a.cache.Add(key, st, TTL)
	}
	if st.Allowed && !st.Denied {
		return nil
	}
	return &DeniedError{User: caller.Username, Permission: p, Namespace: namespace, Name: name, Reason: st.Reason}
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

// Gate admits to the whole server the callers who have Permission in
// Namespace. It implements auth.CallerAuthorizer: the docker backend's
// authorization under --auth kubernetes when no allow-list is given, since
// its containers are no Kubernetes objects that RBAC could guard one by
// one.
type Gate struct {
	Authorizer *Authorizer
	Namespace  string
	Permission Permission
}

// Authorize implements auth.CallerAuthorizer: nil, an error matching
// auth.ErrForbidden naming the missing permission, or one matching
// contract.ErrUnavailable.
func (g Gate) Authorize(ctx context.Context, caller contract.Caller) error {
	err := g.Authorizer.Check(ctx, caller, g.Namespace, g.Permission, "")
	var denied *DeniedError
	if errors.As(err, &denied) {
		return fmt.Errorf("%w: %w; this server admits callers who may %s (group %s) in namespace %q: ask a cluster administrator for that permission (RBAC), for example a RoleBinding to the sandbox editor ClusterRole there",
			auth.ErrForbidden, denied, g.Permission, sandboxv1alpha1.GroupVersion.Group, g.Namespace)
	}
	return err
}
