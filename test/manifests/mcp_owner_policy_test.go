/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package manifests

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

const (
	mcpOwnerPolicyName   = "code-sandbox-mcp-owner-labels"
	mcpOwnerPolicyDenied = "ValidatingAdmissionPolicy '" + mcpOwnerPolicyName + "' with binding '" + mcpOwnerPolicyName + "' denied request"
	mcpSA                = "code-sandbox-mcp-server"
	// kubebackend.LabelOwner and AnnotationIdentity, spelled out: the
	// specs test the rendered manifests.
	mcpOwnerLabel         = "sandbox.code-sandbox.dev/mcp-owner"
	mcpIdentityAnnotation = "sandbox.code-sandbox.dev/mcp-identity"
	// kubebackend.AnnotationExposures: the preview URLs' revocation record.
	mcpExposuresAnnotation = "sandbox.code-sandbox.dev/mcp-exposures"
)

var _ = Describe("The MCP ownership policy of the default overlay, applied for real", Ordered, func() {
	var (
		ns string
		// carol is namespace admin (the built-in admin role with the
		// shipped roles aggregated into it); mcp is the MCP server's
		// rendered ServiceAccount; impostor a ServiceAccount of that name in
		// another namespace, with the same RBAC.
		carol, mcp, impostor client.Client
	)

	BeforeAll(func(ctx SpecContext) {
		objs := render("config/default")
		prepare(ctx, objs)
		for _, o := range objs {
			switch o.GetKind() {
			case "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount":
				Expect(applyForReal(ctx, o)).To(Succeed(), describe(o))
			}
		}
		aggregate(ctx)
		ns = cp.NewNamespace("mcp-owner-")
		cp.Bind(ns, "admin", testenv.UserSubject("carol"))
		carol = impersonate("carol")
		tr, err := cp.Clientset.CoreV1().ServiceAccounts(installNamespace).CreateToken(ctx, mcpSA,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		mcp = tokenClient(tr.Status.Token)
		impostorToken := cp.ServiceAccountToken(ns, mcpSA)
		cp.BindCluster("code-sandbox-mcp-server-role", testenv.ServiceAccountSubject(ns, mcpSA))
		impostor = tokenClient(impostorToken)

		Expect(carol.Create(ctx, newSandbox(ns, "probe", ""))).To(Succeed())
		probe := func(ctx SpecContext) error {
			return patchSandbox(ctx, carol, ns, "probe", map[string]any{"metadata": map[string]any{"labels": map[string]any{mcpOwnerLabel: "id-probe"}}}, client.DryRunAll)
		}
		Expect(probe(ctx)).To(Succeed(), "refused before the policy was installed")
		// As rendered: cluster-scoped, fails closed, denies, and spares
		// only the rendered MCP ServiceAccount.
		vap := &admissionregistrationv1.ValidatingAdmissionPolicy{}
		convert(find(objs, "ValidatingAdmissionPolicy", mcpOwnerPolicyName), vap)
		Expect(vap.Namespace).To(BeEmpty())
		Expect(vap.Spec.FailurePolicy).To(HaveValue(Equal(admissionregistrationv1.Fail)))
		Expect(vap.Spec.MatchConditions).To(ConsistOf(HaveField("Expression",
			"request.userInfo.username != 'system:serviceaccount:' + '"+installNamespace+"' + ':' + '"+mcpSA+"'")))
		binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
		convert(find(objs, "ValidatingAdmissionPolicyBinding", mcpOwnerPolicyName), binding)
		Expect(binding.Spec.PolicyName).To(Equal(mcpOwnerPolicyName))
		Expect(binding.Spec.ValidationActions).To(ConsistOf(admissionregistrationv1.Deny))
		for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
			o := find(objs, kind, mcpOwnerPolicyName)
			Expect(applyForReal(ctx, o)).To(Succeed(), describe(o))
			DeferCleanup(func(ctx SpecContext) {
				Expect(client.IgnoreNotFound(cp.Client.Delete(ctx, o))).To(Succeed())
			})
		}
		Eventually(probe).WithContext(ctx).WithTimeout(30 * time.Second).Should(MatchError(ContainSubstring(mcpOwnerPolicyDenied)))
	})

	owned := func(name, owner string) *unstructured.Unstructured {
		sbx := newSandbox(ns, name, "")
		sbx.SetLabels(map[string]string{mcpOwnerLabel: owner, "app.kubernetes.io/managed-by": "code-sandbox-mcp"})
		sbx.SetAnnotations(map[string]string{mcpIdentityAnnotation: "system:serviceaccount:team:agent"})
		return sbx
	}

	It("refuses a namespace admin creating a Sandbox that carries the owner label or the identity annotation", func(ctx SpecContext) {
		expectMCPOwnerRefusal(carol.Create(ctx, owned("forged", "id-0123456789abcdef")), "may not create Sandbox "+ns+"/forged with the label "+mcpOwnerLabel+" or the annotation")
		sbx := newSandbox(ns, "forged-annotation", "")
		sbx.SetAnnotations(map[string]string{mcpIdentityAnnotation: "someone"})
		expectMCPOwnerRefusal(carol.Create(ctx, sbx), "the annotation "+mcpIdentityAnnotation)
		// The ServiceAccount of that name in another namespace is no MCP
		// server.
		expectMCPOwnerRefusal(impostor.Create(ctx, owned("impostor", "id-0123456789abcdef")), "may not create")
	})

	It("refuses a namespace admin creating or labelling a SandboxSnapshot as an MCP identity's, and lets the MCP server", func(ctx SpecContext) {
		snap := func(name string, labels map[string]string) *unstructured.Unstructured {
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "sandbox.code-sandbox.dev/v1alpha1", "kind": "SandboxSnapshot",
				"metadata": map[string]any{"namespace": ns, "name": name},
				"spec":     map[string]any{"sandboxRef": map[string]any{"name": "probe"}},
			}}
			u.SetLabels(labels)
			return u
		}
		expectMCPOwnerRefusal(carol.Create(ctx, snap("forged-snap", map[string]string{mcpOwnerLabel: "id-0123456789abcdef"})),
			"may not create SandboxSnapshot "+ns+"/forged-snap with the label "+mcpOwnerLabel)
		Expect(carol.Create(ctx, snap("plain-snap", nil))).To(Succeed())
		plain := snap("plain-snap", nil)
		Expect(carol.Get(ctx, client.ObjectKeyFromObject(plain), plain)).To(Succeed())
		plain.SetLabels(map[string]string{mcpOwnerLabel: "id-0123456789abcdef"})
		expectMCPOwnerRefusal(carol.Update(ctx, plain), "on SandboxSnapshot "+ns+"/plain-snap the label "+mcpOwnerLabel)
		Expect(mcp.Create(ctx, snap("by-mcp-snap", map[string]string{mcpOwnerLabel: "id-0123456789abcdef"}))).To(Succeed())
	})

	It("lets the MCP server create its Sandboxes with both, and the namespace admin edit everything else on them", func(ctx SpecContext) {
		Expect(mcp.Create(ctx, owned("by-mcp", "id-0123456789abcdef"))).To(Succeed())
		Expect(patchSandbox(ctx, carol, ns, "by-mcp", map[string]any{
			"metadata": map[string]any{"labels": map[string]any{"team": "carol"}, "annotations": map[string]any{"note": "by carol"}},
			"spec":     map[string]any{"activeDeadlineSeconds": int64(1800)},
		})).To(Succeed())
		sbx := getSandbox(ctx, cp.Client, ns, "by-mcp")
		Expect(sbx.GetLabels()).To(HaveKeyWithValue(mcpOwnerLabel, "id-0123456789abcdef"))
		Expect(sbx.GetLabels()).To(HaveKeyWithValue("team", "carol"))
		// A PUT that carries the record unchanged passes too.
		sbx = getSandbox(ctx, carol, ns, "by-mcp")
		sbx.SetAnnotations(map[string]string{mcpIdentityAnnotation: "system:serviceaccount:team:agent", "note": "again"})
		Expect(carol.Update(ctx, sbx)).To(Succeed())
		// And the MCP server's own updates (it pauses and resumes).
		Expect(patchSandbox(ctx, mcp, ns, "by-mcp", map[string]any{"spec": map[string]any{"paused": true}})).To(Succeed())
	})

	It("lets only the MCP server write the exposures record (preview URLs), so nobody brings back a revoked URL", func(ctx SpecContext) {
		const current = `{"8080":{"nonce":"n-current","expires":"2026-01-01T01:00:00Z"}}`
		Expect(patchSandbox(ctx, mcp, ns, "by-mcp", map[string]any{"metadata": map[string]any{"annotations": map[string]any{mcpExposuresAnnotation: current}}})).To(Succeed(), "the MCP server records an exposure")
		before := getSandbox(ctx, cp.Client, ns, "by-mcp")
		// Restoring a revoked nonce, extending the expiry, removing the
		// record or adding one: all refused, by patch and by update.
		for _, v := range []any{`{"8080":{"nonce":"n-revoked","expires":"2026-01-01T01:00:00Z"}}`, `{"8080":{"nonce":"n-current","expires":"2099-01-01T00:00:00Z"}}`, nil} {
			expectMCPOwnerRefusal(patchSandbox(ctx, carol, ns, "by-mcp", map[string]any{"metadata": map[string]any{"annotations": map[string]any{mcpExposuresAnnotation: v}}}),
				"may not set, change or remove on Sandbox "+ns+"/by-mcp the annotation "+mcpExposuresAnnotation)
		}
		sbx := getSandbox(ctx, carol, ns, "by-mcp")
		a := sbx.GetAnnotations()
		a[mcpExposuresAnnotation] = `{}`
		sbx.SetAnnotations(a)
		expectMCPOwnerRefusal(carol.Update(ctx, sbx), "the annotation "+mcpExposuresAnnotation)
		expectUnchanged(ctx, ns, "by-mcp", before)
		created := newSandbox(ns, "forged-exposures", "")
		created.SetAnnotations(map[string]string{mcpExposuresAnnotation: current})
		expectMCPOwnerRefusal(carol.Create(ctx, created), "may not create Sandbox "+ns+"/forged-exposures with the annotation "+mcpExposuresAnnotation)
		expectMCPOwnerRefusal(impostor.Create(ctx, created), "the annotation "+mcpExposuresAnnotation)
		// Everything else stays carol's, and the MCP server revokes.
		Expect(patchSandbox(ctx, carol, ns, "by-mcp", map[string]any{"metadata": map[string]any{"annotations": map[string]any{"note": "still mine"}}})).To(Succeed())
		Expect(patchSandbox(ctx, mcp, ns, "by-mcp", map[string]any{"metadata": map[string]any{"annotations": map[string]any{mcpExposuresAnnotation: `{}`}}})).To(Succeed())
	})

	It("refuses a namespace admin changing, removing or adding the record on an existing Sandbox", func(ctx SpecContext) {
		before := getSandbox(ctx, cp.Client, ns, "by-mcp")
		expectMCPOwnerRefusal(patchSandbox(ctx, carol, ns, "by-mcp", map[string]any{"metadata": map[string]any{"labels": map[string]any{mcpOwnerLabel: "id-fedcba9876543210"}}}), "may not set, change or remove on Sandbox "+ns+"/by-mcp the label")
		expectMCPOwnerRefusal(patchSandbox(ctx, carol, ns, "by-mcp", map[string]any{"metadata": map[string]any{"labels": map[string]any{mcpOwnerLabel: nil}}}), "the label "+mcpOwnerLabel)
		expectMCPOwnerRefusal(patchSandbox(ctx, carol, ns, "by-mcp", map[string]any{"metadata": map[string]any{"annotations": map[string]any{mcpIdentityAnnotation: "carol"}}}), "the annotation "+mcpIdentityAnnotation)
		sbx := getSandbox(ctx, carol, ns, "by-mcp")
		sbx.SetLabels(map[string]string{"team": "carol"})
		expectMCPOwnerRefusal(carol.Update(ctx, sbx), "the label "+mcpOwnerLabel)
		expectUnchanged(ctx, ns, "by-mcp", before)
		// Adding it to a Sandbox the MCP server did not make, too.
		Expect(carol.Create(ctx, newSandbox(ns, "carols", ""))).To(Succeed())
		expectMCPOwnerRefusal(patchSandbox(ctx, carol, ns, "carols", map[string]any{"metadata": map[string]any{"labels": map[string]any{mcpOwnerLabel: "id-0123456789abcdef"}}}), "the label")
		// Deleting is not the policy's business.
		Expect(carol.Delete(ctx, sandboxRef(ns, "by-mcp"))).To(Succeed())
	})
})

func expectMCPOwnerRefusal(err error, message string) {
	GinkgoHelper()
	Expect(err).To(HaveOccurred(), "the MCP ownership policy should have refused this")
	Expect(apierrors.IsForbidden(err)).To(BeTrue(), "403 Forbidden expected: %v", err)
	Expect(err).To(MatchError(ContainSubstring(mcpOwnerPolicyDenied)))
	Expect(err).To(MatchError(ContainSubstring(message)))
}

var _ = Describe("The MCP reservation Lease policy of the default overlay, applied for real", Ordered, func() {
	const (
		policyName = "code-sandbox-mcp-reservations"
		denied     = "ValidatingAdmissionPolicy '" + policyName + "' with binding '" + policyName + "' denied request"
	)
	var (
		ns string
		// dave may do anything in ns (cluster-admin bound there): only the
		// policy stands between him and the records.
		dave, mcp client.Client
	)
	lease := func(name string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Annotations: map[string]string{"sandbox.code-sandbox.dev/mcp-reservations": "{}"}}}
	}

	BeforeAll(func(ctx SpecContext) {
		objs := render("config/default")
		prepare(ctx, objs)
		for _, o := range objs {
			switch o.GetKind() {
			case "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount":
				Expect(applyForReal(ctx, o)).To(Succeed(), describe(o))
			}
		}
		ns = cp.NewNamespace("mcp-reservations-")
		cp.Bind(ns, "cluster-admin", testenv.UserSubject("dave"))
		dave = impersonate("dave")
		tr, err := cp.Clientset.CoreV1().ServiceAccounts(installNamespace).CreateToken(ctx, mcpSA,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		mcp = tokenClient(tr.Status.Token)
		probe := func(ctx SpecContext) error {
			return dave.Create(ctx, lease("mcp-sandboxes-probe"), client.DryRunAll)
		}
		Expect(probe(ctx)).To(Succeed(), "refused before the policy was installed")
		for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
			o := find(objs, kind, policyName)
			Expect(applyForReal(ctx, o)).To(Succeed(), describe(o))
			DeferCleanup(func(ctx SpecContext) {
				Expect(client.IgnoreNotFound(cp.Client.Delete(ctx, o))).To(Succeed())
			})
		}
		Eventually(probe).WithContext(ctx).WithTimeout(30 * time.Second).Should(MatchError(ContainSubstring(denied)))
	})

	It("lets only the MCP server create, update and delete mcp-sandboxes-* Leases, and leaves other Leases alone", func(ctx SpecContext) {
		refused := func(err error, verb string) {
			GinkgoHelper()
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "403 expected: %v", err)
			Expect(err).To(MatchError(ContainSubstring(denied)))
			Expect(err).To(MatchError(ContainSubstring("may not " + verb + " Lease " + ns + "/mcp-sandboxes-id-0123456789abcdef")))
		}
		refused(dave.Create(ctx, lease("mcp-sandboxes-id-0123456789abcdef")), "create")
		Expect(mcp.Create(ctx, lease("mcp-sandboxes-id-0123456789abcdef"))).To(Succeed())
		var l coordinationv1.Lease
		Expect(mcp.Get(ctx, client.ObjectKey{Namespace: ns, Name: "mcp-sandboxes-id-0123456789abcdef"}, &l)).To(Succeed())
		l.Annotations["sandbox.code-sandbox.dev/mcp-reservations"] = `{"mcp-abc":"2026-01-01T00:00:00Z"}`
		Expect(mcp.Update(ctx, &l)).To(Succeed(), "the MCP server updates its record")
		l.Annotations["sandbox.code-sandbox.dev/mcp-reservations"] = "{}"
		refused(dave.Update(ctx, &l), "update")
		refused(dave.Delete(ctx, &l), "delete")
		Expect(dave.Create(ctx, lease("someone-elses-lease"))).To(Succeed(), "another Lease is not the policy's business")
	})

	It("keeps the namespace deletable: a delete-collection is checked per item, and a namespace being deleted is emptied", func(ctx SpecContext) {
		const record = "mcp-sandboxes-id-fedcba9876543210"
		Expect(mcp.Create(ctx, lease(record))).To(Succeed())
		Expect(dave.Create(ctx, lease("other-lease"))).To(Succeed())
		// The collection-level check has no name, and neither have its
		// items' checks: each record is still refused by the object's name.
		err := dave.DeleteAllOf(ctx, &coordinationv1.Lease{}, client.InNamespace(ns))
		Expect(err).To(MatchError(ContainSubstring("may not delete Lease " + ns + "/mcp-sandboxes-")))
		Expect(err).NotTo(MatchError(ContainSubstring("no such key")))
		var l coordinationv1.Lease
		Expect(mcp.Get(ctx, client.ObjectKey{Namespace: ns, Name: record}, &l)).To(Succeed(), "the record was deleted in a live namespace")

		// envtest runs no namespace controller: the namespace stays
		// Terminating, and deleting its contents is what that controller
		// (any user, for the policy) then does.
		var nsObj corev1.Namespace
		Expect(cp.Client.Get(ctx, client.ObjectKey{Name: ns}, &nsObj)).To(Succeed())
		Expect(cp.Client.Delete(ctx, &nsObj)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(cp.Client.Get(ctx, client.ObjectKey{Name: ns}, &nsObj)).To(Succeed())
			g.Expect(nsObj.DeletionTimestamp).NotTo(BeNil())
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		// The policy reads the namespace from the API server's informer,
		// which may lag the delete by a moment.
		Eventually(func() error {
			return dave.DeleteAllOf(ctx, &coordinationv1.Lease{}, client.InNamespace(ns))
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		Expect(apierrors.IsNotFound(mcp.Get(ctx, client.ObjectKey{Namespace: ns, Name: record}, &l))).To(BeTrue(), "the record outlived its namespace's teardown")
	})
})
