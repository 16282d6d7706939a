/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxwarmpool_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// The quota webhook, as cmd/manager wires it, against a real API server:
// what a namespace editor may do to a pool's membership and charges.
var _ = Describe("SandboxWarmPool admission", Ordered, func() {
	var editorRole string
	BeforeAll(func() { editorRole = cp.CreateShippedClusterRole("sandbox_editor_role.yaml") })

	// editor is a client acting as a user who edits Sandboxes in ns (the
	// shipped sandbox-editor-role).
	editor := func(ns string) client.Client {
		GinkgoHelper()
		cp.Bind(ns, editorRole, testenv.UserSubject("eve"))
		cfg := rest.CopyConfig(cp.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: "eve", Groups: []string{"system:authenticated"}}
		c, err := client.New(cfg, client.Options{Scheme: cp.Scheme})
		Expect(err).NotTo(HaveOccurred())
		return c
	}
	countedQuota := func(ns string, hard sandboxv1alpha1.SandboxQuotaHard) *sandboxv1alpha1.SandboxQuota {
		GinkgoHelper()
		q := &sandboxv1alpha1.SandboxQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team"}, Spec: sandboxv1alpha1.SandboxQuotaSpec{Hard: hard}}
		Expect(cp.Client.Create(ctx, q)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(q), q)).To(Succeed())
			g.Expect(q.Status.ObservedGeneration).To(Equal(q.Generation))
		}, timeout, interval).Should(Succeed())
		return q
	}

	It("refuses a namespace editor's forged member, in a namespace without quotas too, while the pool creates its own", func() {
		ns := newNamespace()
		eve := editor(ns)
		pool := newPool(ns, "pool", 1)
		// The create admitted on 90280d9: the pool's labels and a
		// controller ownerReference, paused, 2 CPUs and 2 GiB.
		forged := warmpool.Member(pool)
		forged.Spec.Resources.CPU = ptr.To(resource.MustParse("2"))
		forged.Spec.Resources.Memory = ptr.To(resource.MustParse("2Gi"))
		err := eve.Create(ctx, forged)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err).To(MatchError(ContainSubstring("only the warm pool controller creates warm pool members: a Sandbox created by eve may not carry")))
		status := err.(apierrors.APIStatus).Status()
		Expect(status.Details).NotTo(BeNil())
		Expect(status.Details.Causes).To(ConsistOf(HaveField("Type", subresource.CauseWarmPoolMembership)))
		// The pool controller's member (created as this process's user)
		// is admitted.
		Expect(waitMembers(pool, 1)).To(HaveLen(1))
		// The editor creates ordinary Sandboxes and claimants as before.
		plain := &sandboxv1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"},
			Spec: sandboxv1alpha1.SandboxSpec{Image: testenv.BusyboxImage}}
		Expect(eve.Create(ctx, plain)).To(Succeed())
	})

	It("charges a claimant at a template that cannot grow before the claim: growth and re-creation of the pool are refused", func() {
		ns := newNamespace()
		eve := editor(ns)
		q := countedQuota(ns, sandboxv1alpha1.SandboxQuotaHard{CPU: ptr.To(resource.MustParse("1"))})
		pool := newPool(ns, "pool", 0)
		// No node manager runs here: the claimant stays unclaimed, as one
		// does while every node is full.
		claimant := &sandboxv1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "claimant"},
			Spec: sandboxv1alpha1.SandboxSpec{WarmPoolRef: &sandboxv1alpha1.WarmPoolReference{Name: pool.Name}}}
		Expect(eve.Create(ctx, claimant)).To(Succeed())
		Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(q), q)).To(Succeed())
		Expect(q.Status.Used.CPU.String()).To(Equal("100m"), "charged at the template")

		// The attack: grow the template to ten times the charge.
		grown := getPool(pool)
		grown.Spec.Template.Resources.CPU = ptr.To(resource.MustParse("1"))
		err := cp.Client.Update(ctx, grown)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err).To(MatchError(ContainSubstring("the template's cpu may not grow from 100m to 1 while a sandbox quota of namespace " + ns + " limits cpu")))
		Expect(getPool(pool).Spec.Template.Resources.CPU.String()).To(Equal("100m"))
		// Shrinking is fine.
		updatePool(pool, func(p *sandboxv1alpha1.SandboxWarmPool) {
			p.Spec.Template.Resources.CPU = ptr.To(resource.MustParse("50m"))
		})

		// Or: delete the pool and create a bigger one of the same name.
		Expect(cp.Client.Delete(ctx, getPool(pool))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(cp.Client.Get(ctx, client.ObjectKeyFromObject(pool), &sandboxv1alpha1.SandboxWarmPool{}))
		}, timeout, interval).Should(BeTrue())
		again := &sandboxv1alpha1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pool.Name},
			Spec: sandboxv1alpha1.SandboxWarmPoolSpec{Replicas: ptr.To[int32](0), Template: template()}}
		again.Spec.Template.Resources.CPU = ptr.To(resource.MustParse("1"))
		err = cp.Client.Create(ctx, again)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err).To(MatchError(ContainSubstring(`Sandboxes admitted against an earlier SandboxWarmPool "pool" still wait to claim from it (claimant)`)))

		// Once the claimant is gone, the name is free again.
		Expect(cp.Client.Delete(ctx, claimant)).To(Succeed())
		Eventually(func() error { return cp.Client.Create(ctx, again.DeepCopy()) }, timeout, interval).Should(Succeed())
	})
})
