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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

// What config/policy/sandbox_member_policy.yaml installs, as config/default
// renders it, and the identity it lets create warm pool members: the
// webhook ServiceAccount, which runs the warm pool controller.
const (
	memberPolicyName   = "code-sandbox-sandbox-warm-pool-members"
	memberPolicyDenied = "ValidatingAdmissionPolicy '" + memberPolicyName + "' with binding '" + memberPolicyName + "' denied request"
	webhookSA          = "code-sandbox-webhook"
	webhookUser        = "system:serviceaccount:" + installNamespace + ":" + webhookSA
	labelWarmPool      = group + "/warm-pool"
	labelTemplateHash  = group + "/template-hash"
)

var _ = Describe("The warm pool member policy as config/default renders it", func() {
	It("is cluster-scoped, fails closed, denies, matches creates and updates of Sandboxes and names the rendered webhook ServiceAccount", func() {
		objs := render("config/default")
		vap := &admissionregistrationv1.ValidatingAdmissionPolicy{}
		convert(find(objs, "ValidatingAdmissionPolicy", memberPolicyName), vap)
		binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
		convert(find(objs, "ValidatingAdmissionPolicyBinding", memberPolicyName), binding)

		Expect(vap.Namespace).To(BeEmpty())
		Expect(binding.Namespace).To(BeEmpty())
		Expect(binding.Spec.PolicyName).To(Equal(vap.Name))
		Expect(binding.Spec.ValidationActions).To(Equal([]admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}))
		Expect(binding.Spec.ParamRef).To(BeNil())
		Expect(binding.Spec.MatchResources).To(BeNil())
		Expect(vap.Spec.FailurePolicy).To(HaveValue(Equal(admissionregistrationv1.Fail)))
		Expect(vap.Spec.MatchConditions).To(BeEmpty(), "everyone, the cluster administrator included")
		Expect(vap.Spec.MatchConstraints.ResourceRules).To(HaveLen(1))
		rule := vap.Spec.MatchConstraints.ResourceRules[0]
		Expect(rule.APIGroups).To(Equal([]string{group}))
		Expect(rule.Resources).To(Equal([]string{"sandboxes"}))
		Expect(rule.Operations).To(ConsistOf(admissionregistrationv1.Create, admissionregistrationv1.Update))
		for _, v := range vap.Spec.Validations {
			Expect(v.Reason).To(HaveValue(Equal(metav1.StatusReasonForbidden)), v.Expression)
			Expect(v.MessageExpression).NotTo(BeEmpty(), v.Expression)
		}
		Expect(vap.Spec.Variables).To(ContainElement(admissionregistrationv1.Variable{
			Name:       "poolController",
			Expression: "'system:serviceaccount:' + '" + installNamespace + "' + ':' + '" + webhookSA + "'",
		}))
		// The Deployment that runs the pool controller runs as that
		// ServiceAccount.
		deploy := find(objs, "Deployment", "code-sandbox-webhook")
		sa, _, _ := unstructured.NestedString(deploy.Object, "spec", "template", "spec", "serviceAccountName")
		Expect(sa).To(Equal(webhookSA))

		alone := &admissionregistrationv1.ValidatingAdmissionPolicy{}
		convert(find(render("config/policy"), "ValidatingAdmissionPolicy", "sandbox-warm-pool-members"), alone)
		Expect(alone.Spec.Variables).To(ContainElement(admissionregistrationv1.Variable{
			Name: "poolController", Expression: "'system:serviceaccount:' + 'system' + ':' + 'webhook'",
		}))
	})
})

// The member policy installed for real with the RBAC of config/default: a
// namespace editor forges a member of a pool (its labels and a controller
// ownerReference, paused, 2 CPUs and 2 GiB), as was admitted on 90280d9.
var _ = Describe("The warm pool member policy of the default overlay, applied for real", Ordered, func() {
	var (
		ns string
		// eve edits the namespace (the built-in edit role with the shipped
		// roles aggregated into it).
		eve client.Client
		// The webhook ServiceAccount, and one named like it in another
		// namespace with the same RBAC.
		poolController, impostor client.Client
		poolUID                  = string(uuid.NewUUID())
	)

	// forged is a Sandbox as a member of pool "pool" would look, with a
	// shape of the forger's choosing.
	forged := func(name string, labels map[string]string, owners []any) *unstructured.Unstructured {
		u := newSandbox(ns, name, "")
		u.SetLabels(labels)
		if owners != nil {
			u.Object["metadata"].(map[string]any)["ownerReferences"] = owners
		}
		spec := u.Object["spec"].(map[string]any)
		spec["paused"] = true
		spec["image"] = "attacker/image:latest"
		spec["command"] = []any{"/bin/sh", "-c", "evil"}
		spec["resources"] = map[string]any{"cpu": "2", "memory": "2Gi"}
		spec["network"] = map[string]any{"mode": "Egress"}
		return u
	}
	poolRef := func(controller bool) []any {
		return []any{map[string]any{"apiVersion": group + "/v1alpha1", "kind": "SandboxWarmPool", "name": "pool",
			"uid": poolUID, "controller": controller, "blockOwnerDeletion": true}}
	}
	memberLabels := map[string]string{labelWarmPool: "pool", labelTemplateHash: "0123456789abcdef"}

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
		ns = cp.NewNamespace("members-")
		cp.Bind(ns, "edit", testenv.UserSubject("eve"))
		eve = impersonate("eve")
		// The rendered ServiceAccount exists (applied above).
		tr, err := cp.Clientset.CoreV1().ServiceAccounts(installNamespace).CreateToken(ctx, webhookSA,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		poolController = tokenClient(tr.Status.Token)
		impostor = tokenClient(cp.ServiceAccountToken(ns, webhookSA))
		cp.Bind(ns, "edit", testenv.ServiceAccountSubject(ns, webhookSA))
		expectAccess(ctx, user("eve"), []access{in(ns, "create", "sandboxes"), in(ns, "update", "sandboxes")}, nil)
		expectAccess(ctx, serviceAccount(installNamespace, webhookSA), []access{in(ns, "create", "sandboxes")}, nil)

		Expect(cp.Client.Create(ctx, newSandbox(ns, "plain", ""))).To(Succeed())
		probe := func(ctx SpecContext) error {
			return cp.Client.Create(ctx, forged("probe", memberLabels, nil), client.DryRunAll)
		}
		Expect(probe(ctx)).To(Succeed(), "refused before the policy was installed")
		// Before the policy, the editor's forged member is admitted (as on
		// 90280d9).
		Expect(eve.Create(ctx, forged("before", memberLabels, poolRef(true)), client.DryRunAll)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			Eventually(probe).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		})
		for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
			o := find(objs, kind, memberPolicyName)
			Expect(applyForReal(ctx, o)).To(Succeed(), describe(o))
			DeferCleanup(func(ctx SpecContext) {
				Expect(client.IgnoreNotFound(cp.Client.Delete(ctx, o))).To(Succeed())
			})
		}
		Eventually(probe).WithContext(ctx).WithTimeout(30 * time.Second).Should(MatchError(ContainSubstring(memberPolicyDenied)))
	})

	It("refuses a namespace editor's create of a forged member, whichever mark of membership it carries", func(ctx SpecContext) {
		for name, sbx := range map[string]*unstructured.Unstructured{
			"labels-and-owner": forged("labels-and-owner", memberLabels, poolRef(true)),
			"label":            forged("label", map[string]string{labelWarmPool: "pool"}, nil),
			"hash-label":       forged("hash-label", map[string]string{labelTemplateHash: "0123456789abcdef"}, nil),
			"owner":            forged("owner", nil, poolRef(true)),
			"owner-not-ctrl":   forged("owner-not-ctrl", nil, poolRef(false)),
		} {
			err := eve.Create(ctx, sbx)
			expectMemberPolicyRefusal(err, "only the warm pool controller ("+webhookUser+") creates warm pool members: eve may not create Sandbox "+ns+"/"+name)
			Expect(apierrors.IsNotFound(cp.Client.Get(ctx, client.ObjectKeyFromObject(sbx), sbx))).To(BeTrue(), name)
		}
		expectMemberPolicyRefusal(eve.Create(ctx, forged("labels-and-owner", memberLabels, poolRef(true))),
			"with the label "+labelWarmPool+", "+labelTemplateHash)
		expectMemberPolicyRefusal(eve.Create(ctx, forged("owner", nil, poolRef(true))), "with an ownerReference to SandboxWarmPool pool")
	})

	It("refuses the cluster administrator and a ServiceAccount named like the webhook's in another namespace", func(ctx SpecContext) {
		expectMemberPolicyRefusal(cp.Client.Create(ctx, forged("by-admin", memberLabels, poolRef(true))), "creates warm pool members")
		expectMemberPolicyRefusal(impostor.Create(ctx, forged("by-impostor", memberLabels, poolRef(true))),
			"system:serviceaccount:"+ns+":"+webhookSA+" may not create")
	})

	It("lets the pool controller's ServiceAccount create members, and anyone create Sandboxes without membership", func(ctx SpecContext) {
		member := newSandbox(ns, "member", "")
		member.SetLabels(memberLabels)
		member.Object["metadata"].(map[string]any)["ownerReferences"] = poolRef(true)
		Expect(poolController.Create(ctx, member)).To(Succeed())
		plain := newSandbox(ns, "eves", "")
		plain.SetLabels(map[string]string{"team": "eve"})
		Expect(eve.Create(ctx, plain)).To(Succeed())
	})

	It("refuses anyone, the cluster administrator included, an update that adds or changes membership, and allows removing it", func(ctx SpecContext) {
		label := func(k, v string) map[string]any {
			return map[string]any{"metadata": map[string]any{"labels": map[string]any{k: v}}}
		}
		expectMemberPolicyRefusal(patchSandbox(ctx, eve, ns, "plain", label(labelWarmPool, "pool")),
			"eve may not make Sandbox "+ns+"/plain a warm pool member or move it to another pool (label "+labelWarmPool+")")
		expectMemberPolicyRefusal(patchSandbox(ctx, cp.Client, ns, "plain", label(labelTemplateHash, "x")), "a warm pool member")
		expectMemberPolicyRefusal(patchSandbox(ctx, eve, ns, "plain",
			map[string]any{"metadata": map[string]any{"ownerReferences": poolRef(false)}}), "(ownerReference to SandboxWarmPool pool)")
		expectMemberPolicyRefusal(patchSandbox(ctx, eve, ns, "member", label(labelWarmPool, "other")), "or move it to another pool")
		expectMemberPolicyRefusal(patchSandbox(ctx, eve, ns, "member", label(labelTemplateHash, "fedcba9876543210")), "a warm pool member")
		// With PUT too. (The pool controller's ServiceAccount may not
		// update Sandboxes at all.)
		sbx := getSandbox(ctx, eve, ns, "plain")
		sbx.SetLabels(memberLabels)
		expectMemberPolicyRefusal(eve.Update(ctx, sbx), "a warm pool member")
		Expect(getSandbox(ctx, cp.Client, ns, "plain").GetLabels()).NotTo(HaveKey(labelWarmPool))

		// Other labels, and taking membership away (as the garbage
		// collector orphans a member), pass.
		Expect(patchSandbox(ctx, eve, ns, "member", label("team", "eve"))).To(Succeed())
		Expect(patchSandbox(ctx, cp.Client, ns, "member", map[string]any{"metadata": map[string]any{
			"labels": map[string]any{labelWarmPool: nil, labelTemplateHash: nil}, "ownerReferences": nil,
		}})).To(Succeed())
		Expect(getSandbox(ctx, cp.Client, ns, "member").GetOwnerReferences()).To(BeEmpty())
	})
})

// expectMemberPolicyRefusal checks that err is the member policy's 403 with
// message.
func expectMemberPolicyRefusal(err error, message string) {
	GinkgoHelper()
	Expect(err).To(HaveOccurred(), "the member policy should have refused this")
	Expect(apierrors.IsForbidden(err)).To(BeTrue(), "403 Forbidden expected: %v", err)
	Expect(err).To(MatchError(ContainSubstring(memberPolicyDenied)))
	Expect(err).To(MatchError(ContainSubstring(message)))
}
