/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package kubebackend

import (
	"context"
	"errors"
	"log/slog"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
	"github.com/code-sandbox/code-sandbox-operator/internal/sandboxclient"
)

// Preview URLs on two replicas: the exposure record is on the Sandbox, so
// what one replica exposes or revokes holds on the other. startManager's
// Sandboxes point at a node API nobody serves, so a dial that passes every
// check ends in a connection error, not in a refusal.
var _ = Describe("Exposed ports on two replicas", Ordered, func() {
	var (
		ctx          context.Context
		ns           string
		alice, bob   contract.Caller
		a, b         *Backend
		sb, other    contract.Sandbox
		check        func(r *Backend, x contract.Exposure) func() error
		exposureOf   func(nonce string) contract.Exposure
		recordOnSbx  func(id string) string
		aliceOwner   string
		replicaFresh func() *Backend
	)

	BeforeAll(func() {
		ctx = context.Background()
		ns = cp.NewNamespace("mcp-ports")
		alice, bob = contract.Caller{ID: "alice@example.com"}, contract.Caller{ID: "bob@example.com"}
		aliceOwner = contract.IdentityHash(alice.ID)
		startManager(ns)
		replicaFresh = func() *Backend {
			GinkgoHelper()
			r, err := New(Options{Config: cp.Config, Namespace: ns, MaxSandboxes: 5,
				IdleTimeout: 10 * time.Minute, ReadyTimeout: 30 * time.Second, StopTimeout: 10 * time.Second,
				Logger: slog.New(slog.NewTextHandler(GinkgoWriter, nil))})
			Expect(err).NotTo(HaveOccurred())
			rctx, cancel := context.WithCancel(ctx)
			r.Start(rctx)
			DeferCleanup(func() { _ = r.Close(context.Background()); cancel() })
			Eventually(r.Ready).WithArguments(ctx).WithTimeout(30 * time.Second).Should(Succeed())
			return r
		}
		a, b = replicaFresh(), replicaFresh()
		var err error
		sb, err = a.Create(ctx, alice, contract.CreateRequest{Image: "busybox:1", Lifetime: time.Hour})
		Expect(err).NotTo(HaveOccurred())
		other, err = a.Create(ctx, alice, contract.CreateRequest{Image: "busybox:1", Lifetime: time.Hour})
		Expect(err).NotTo(HaveOccurred())
		check = func(r *Backend, x contract.Exposure) func() error {
			return func() error { return r.CheckExposed(ctx, x) }
		}
		exposureOf = func(nonce string) contract.Exposure {
			return contract.Exposure{Owner: aliceOwner, ID: sb.ID, Port: 8080, Nonce: nonce}
		}
		recordOnSbx = func(id string) string {
			var obj sandboxv1alpha1.Sandbox
			Expect(cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: id}, &obj)).To(Succeed())
			return obj.Annotations[AnnotationExposures]
		}
	})

	It("serves on B what A exposed, and nothing else: another nonce, port, owner or sandbox is refused", func() {
		Expect(a.Expose(ctx, alice, sb.ID, 8080, "nonce-one", time.Now().Add(time.Hour))).To(Succeed())
		Expect(recordOnSbx(sb.ID)).To(ContainSubstring(`"8080":{"nonce":"nonce-one"`))
		// At once: B's cache may not have the record yet, and a refusal
		// is read again from the API server.
		Expect(check(b, exposureOf("nonce-one"))()).To(Succeed(), "replica B does not serve A's exposure")

		Expect(b.CheckExposed(ctx, exposureOf("nonce-two"))).To(MatchError(contract.ErrNotExposed), "a tampered nonce")
		x := exposureOf("nonce-one")
		x.Port = 8081
		Expect(b.CheckExposed(ctx, x)).To(MatchError(contract.ErrNotExposed), "another port")
		x = exposureOf("nonce-one")
		x.ID = other.ID
		Expect(b.CheckExposed(ctx, x)).To(MatchError(contract.ErrNotExposed), "the owner's other sandbox")
		x = exposureOf("nonce-one")
		x.Owner = contract.IdentityHash(bob.ID)
		Expect(b.CheckExposed(ctx, x)).To(MatchError(contract.ErrNotFound), "another owner")
		x = exposureOf("nonce-one")
		x.ID = "mcp-nosuchsandbox"
		Expect(b.CheckExposed(ctx, x)).To(MatchError(contract.ErrNotFound), "a sandbox that does not exist")
		x.ID = "../" + sb.ID
		Expect(b.CheckExposed(ctx, x)).To(MatchError(contract.ErrNotFound), "a name that is no sandbox's")

		// Bob may not expose alice's sandbox, nor revoke her URL.
		Expect(b.Expose(ctx, bob, sb.ID, 8080, "bobs", time.Now().Add(time.Hour))).To(MatchError(contract.ErrNotFound))
		had, err := b.Unexpose(ctx, bob, sb.ID, 8080)
		Expect(err).To(MatchError(contract.ErrNotFound))
		Expect(had).To(BeFalse())
		Expect(b.CheckExposed(ctx, exposureOf("nonce-one"))).To(Succeed())

		// The dial passes every check and then asks the API server for
		// sandboxes/portforward with the server's own credentials; envtest
		// serves no aggregated API, so the answer is that API's 404. A
		// refused URL never gets that far.
		_, err = b.DialExposed(ctx, exposureOf("nonce-one"))
		var apiErr *sandboxclient.APIError
		Expect(errors.As(err, &apiErr)).To(BeTrue(), "the dial did not reach the subresource: %v", err)
		Expect(err).NotTo(MatchError(contract.ErrNotExposed))
		_, err = b.DialExposed(ctx, exposureOf("nonce-two"))
		Expect(err).To(MatchError(contract.ErrNotExposed))
		Expect(errors.As(err, &apiErr)).To(BeFalse())
	})

	It("revokes on every replica: unexpose on B is refused on A, re-expose on A retires the old URL on B", func() {
		had, err := b.Unexpose(ctx, alice, sb.ID, 8080)
		Expect(err).NotTo(HaveOccurred())
		Expect(had).To(BeTrue())
		Eventually(check(a, exposureOf("nonce-one"))).Should(MatchError(contract.ErrNotExposed), "A still serves a URL B revoked")
		had, err = a.Unexpose(ctx, alice, sb.ID, 8080)
		Expect(err).NotTo(HaveOccurred())
		Expect(had).To(BeFalse())

		Expect(a.Expose(ctx, alice, sb.ID, 8080, "nonce-three", time.Now().Add(time.Hour))).To(Succeed())
		Expect(check(b, exposureOf("nonce-three"))()).To(Succeed())
		Expect(a.Expose(ctx, alice, sb.ID, 8080, "nonce-four", time.Now().Add(time.Hour))).To(Succeed())
		Eventually(check(b, exposureOf("nonce-three"))).Should(MatchError(contract.ErrNotExposed), "B still serves a replaced URL")
		Expect(b.CheckExposed(ctx, exposureOf("nonce-four"))).To(Succeed())
	})

	It("lets concurrent exposes of several ports on two replicas all land, and expires them by the record", func() {
		done := make(chan error, 8)
		for i := range 8 {
			r := a
			if i%2 == 1 {
				r = b
			}
			go func() { done <- r.Expose(ctx, alice, other.ID, 9000+i, "n", time.Now().Add(time.Hour)) }()
		}
		for range 8 {
			Expect(<-done).To(Succeed())
		}
		for i := range 8 {
			Expect(check(a, contract.Exposure{Owner: aliceOwner, ID: other.ID, Port: 9000 + i, Nonce: "n"})()).To(Succeed(), "port %d lost", 9000+i)
		}
		Expect(b.Expose(ctx, alice, other.ID, 7000, "short", time.Now().Add(1500*time.Millisecond))).To(Succeed())
		short := contract.Exposure{Owner: aliceOwner, ID: other.ID, Port: 7000, Nonce: "short"}
		Expect(check(a, short)()).To(Succeed())
		Eventually(check(a, short)).WithTimeout(5*time.Second).Should(MatchError(contract.ErrNotExposed), "an expired exposure is still served")
	})

	It("ends every URL of a sandbox with the sandbox, on every replica", func() {
		Expect(a.Stop(ctx, alice, sb.ID)).To(Succeed())
		Eventually(check(b, exposureOf("nonce-four"))).Should(MatchError(contract.ErrNotFound))
		Expect(b.Expose(ctx, alice, sb.ID, 8080, "late", time.Now().Add(time.Hour))).To(MatchError(contract.ErrNotFound))
	})
})
