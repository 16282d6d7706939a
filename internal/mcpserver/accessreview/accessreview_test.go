/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package accessreview

import (
	"context"
	"errors"
	"testing"

	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/auth"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestAccessReview(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "accessreview suite (unit)")
}

type reviewer struct {
	allow   bool
	fail    error
	reviews []*authzv1.SubjectAccessReview
}

func (r *reviewer) Create(_ context.Context, sar *authzv1.SubjectAccessReview, _ metav1.CreateOptions) (*authzv1.SubjectAccessReview, error) {
	r.reviews = append(r.reviews, sar)
	if r.fail != nil {
		return nil, r.fail
	}
	out := sar.DeepCopy()
	out.Status.Allowed = r.allow
	return out, nil
}

var _ = Describe("Gate", Label("unit"), func() {
	ctx := context.Background()
	alice := contract.Caller{ID: "kube:alice", Username: "alice", UID: "u", Groups: []string{"devs"}}
	gate := func(r *reviewer) Gate {
		return Gate{Authorizer: New(r), Namespace: "team-a", Permission: Permission{Verb: "create"}}
	}

	It("asks for create sandboxes in the namespace for exactly the caller, and caches the answer", func() {
		r := &reviewer{allow: true}
		g := gate(r)
		Expect(g.Authorize(ctx, alice)).To(Succeed())
		Expect(g.Authorize(ctx, alice)).To(Succeed())
		Expect(r.reviews).To(HaveLen(1), "the decision was not cached")
		spec := r.reviews[0].Spec
		Expect(spec.User).To(Equal("alice"))
		Expect(spec.UID).To(Equal("u"))
		Expect(spec.Groups).To(Equal([]string{"devs"}))
		Expect(*spec.ResourceAttributes).To(Equal(authzv1.ResourceAttributes{
			Namespace: "team-a", Verb: "create", Group: "sandbox.code-sandbox.dev", Version: "v1alpha1", Resource: "sandboxes"}))
	})

	It("caches a denial too, and reviews another namespace or caller afresh", func() {
		r := &reviewer{}
		g := gate(r)
		Expect(g.Authorize(ctx, alice)).To(MatchError(auth.ErrForbidden))
		r.allow = true
		Expect(g.Authorize(ctx, alice)).To(MatchError(auth.ErrForbidden), "the denial was not cached")
		Expect(r.reviews).To(HaveLen(1))
		g.Namespace = "team-b"
		Expect(g.Authorize(ctx, alice)).To(Succeed())
		Expect(g.Authorize(ctx, contract.Caller{ID: "kube:alice", Username: "alice", UID: "u", Groups: []string{"devs", "admins"}})).To(Succeed())
		Expect(r.reviews).To(HaveLen(3), "a decision was taken for another namespace or group set")
	})

	It("refuses with ErrForbidden naming the missing permission", func() {
		err := gate(&reviewer{}).Authorize(ctx, alice)
		Expect(err).To(MatchError(auth.ErrForbidden))
		Expect(err.Error()).To(And(ContainSubstring(`user "alice" may not create sandboxes in namespace "team-a"`), ContainSubstring("sandbox.code-sandbox.dev")))
		var denied *DeniedError
		Expect(errors.As(err, &denied)).To(BeTrue())
	})

	It("refuses a caller that is not a Kubernetes identity without asking", func() {
		r := &reviewer{allow: true}
		err := gate(r).Authorize(ctx, contract.Caller{ID: auth.AnonymousIdentity})
		Expect(err).To(MatchError(auth.ErrForbidden))
		Expect(r.reviews).To(BeEmpty())
	})

	It("reports an API server that does not answer as unavailable, not forbidden", func() {
		err := gate(&reviewer{fail: errors.New("connection refused")}).Authorize(ctx, alice)
		Expect(err).To(MatchError(contract.ErrUnavailable))
		Expect(err).NotTo(MatchError(auth.ErrForbidden))
	})
})
