/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package manifests

import (
	"encoding/json"
	"reflect"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

// What config/policy installs, as config/default renders it.
const (
	policyName   = "code-sandbox-sandbox-status-writers"
	managerSA    = "code-sandbox-controller-manager"
	managerUser  = "system:serviceaccount:" + installNamespace + ":" + managerSA
	nodeNameKey  = "authentication.kubernetes.io/node-name"
	policyDenied = "ValidatingAdmissionPolicy '" + policyName + "' with binding '" + policyName + "' denied request"
	// The policy that confines the managers' main-resource updates to the
	// finalizers of their own node's Sandboxes.
	managerPolicyName   = "code-sandbox-sandbox-manager-updates"
	managerPolicyDenied = "ValidatingAdmissionPolicy '" + managerPolicyName + "' with binding '" + managerPolicyName + "' denied request"
	// The policy that confines each manager's Lease writes to its own
	// node's Lease (nodelease.NamePrefix, spelled out here).
	leasePolicyName   = "code-sandbox-node-manager-leases"
	leasePolicyDenied = "ValidatingAdmissionPolicy '" + leasePolicyName + "' with binding '" + leasePolicyName + "' denied request"
	leasePrefix       = "code-sandbox-node-"
	coordination      = "coordination.k8s.io"
	// The manager's finalizer (sandbox.Finalizer in controllers/sandbox; spelled out, as the
	// specs test the rendered manifests).
	managerFinalizer = "sandbox.code-sandbox.dev/container"
	// The node managers' nodes in these specs.
	// controlPlaneSA runs manager --role control-plane, whose node-loss
	// controller alone may mark a Sandbox NodeLost.
	controlPlaneSA = "code-sandbox-webhook"
	// controlPlanePolicyName confines the control plane's main-resource
	// updates to releasing the manager's finalizer of a deleted Sandbox.
	controlPlanePolicyName   = "code-sandbox-sandbox-control-plane-updates"
	controlPlanePolicyDenied = "ValidatingAdmissionPolicy '" + controlPlanePolicyName + "' with binding '" + controlPlanePolicyName + "' denied request"

	nodeA = "policy-node-a"
	nodeB = "policy-node-b"
)

var _ = Describe("The Sandbox status policy as config/default renders it", func() {
	It("is cluster-scoped, fails closed, denies, matches only status updates and names the rendered manager ServiceAccount", func() {
		objs := render("config/default")
		vap := &admissionregistrationv1.ValidatingAdmissionPolicy{}
		convert(find(objs, "ValidatingAdmissionPolicy", policyName), vap)
		binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
		convert(find(objs, "ValidatingAdmissionPolicyBinding", policyName), binding)

		// Rule 5 compares every status field but nodeName and conditions:
		// a field added to SandboxStatus must be added there too.
		var unchanged string
		for _, v := range vap.Spec.Variables {
			if v.Name == "unchanged" {
				unchanged = v.Expression
			}
		}
		st := reflect.TypeOf(sandboxv1alpha1.SandboxStatus{})
		for i := range st.NumField() {
			field, _, _ := strings.Cut(st.Field(i).Tag.Get("json"), ",")
			if field == "nodeName" || field == "conditions" {
				continue
			}
			Expect(unchanged).To(ContainSubstring("object.?status.?"+field+" == oldObject.?status.?"+field),
				"status.%s is missing from the policy's unchanged rule", field)
		}

		Expect(vap.Namespace).To(BeEmpty(), "a ValidatingAdmissionPolicy is cluster-scoped")
		Expect(binding.Namespace).To(BeEmpty(), "a ValidatingAdmissionPolicyBinding is cluster-scoped")
		Expect(binding.Spec.PolicyName).To(Equal(vap.Name))
		Expect(binding.Spec.ValidationActions).To(Equal([]admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}))
		Expect(binding.Spec.ParamRef).To(BeNil())
		Expect(binding.Spec.MatchResources).To(BeNil(), "the binding applies wherever the policy matches")

		Expect(vap.Spec.FailurePolicy).To(HaveValue(Equal(admissionregistrationv1.Fail)))
		Expect(vap.Spec.MatchConditions).To(BeEmpty())
		Expect(vap.Spec.MatchConstraints.ResourceRules).To(HaveLen(1))
		rule := vap.Spec.MatchConstraints.ResourceRules[0]
		Expect(rule.APIGroups).To(Equal([]string{group}))
		Expect(rule.Operations).To(Equal([]admissionregistrationv1.OperationType{admissionregistrationv1.Update}),
			"only UPDATE (a PATCH arrives as one): never DELETE, and nothing on the main resource")
		Expect(rule.Resources).To(Equal([]string{"sandboxes/status"}))
		Expect(vap.Spec.MatchConstraints.ExcludeResourceRules).To(BeEmpty())
		for _, v := range vap.Spec.Validations {
			Expect(v.Reason).To(HaveValue(Equal(metav1.StatusReasonForbidden)), v.Expression)
			Expect(v.MessageExpression).NotTo(BeEmpty(), v.Expression)
		}

		// The ServiceAccount the DaemonSet runs as, rendered by namespace
		// and namePrefix, is the one the policy's CEL names.
		sa := find(objs, "ServiceAccount", managerSA)
		Expect(sa.GetNamespace()).To(Equal(installNamespace))
		ds := &appsv1.DaemonSet{}
		convert(find(objs, "DaemonSet", managerSA), ds)
		Expect(ds.Spec.Template.Spec.ServiceAccountName).To(Equal(managerSA))
		vars := map[string]string{}
		for _, v := range vap.Spec.Variables {
			vars[v.Name] = v.Expression
		}
		Expect(vars).To(HaveKeyWithValue("managerNamespace", "'"+installNamespace+"'"))
		Expect(vars).To(HaveKeyWithValue("managerAccount", "'"+managerSA+"'"))
		Expect(vars).To(HaveKeyWithValue("manager", "'system:serviceaccount:' + variables.managerNamespace + ':' + variables.managerAccount"))
		Expect(vars).To(HaveKeyWithValue("nodeNames", ContainSubstring("'"+nodeNameKey+"'")))
		// The control plane (the node-loss controller) is the webhook's
		// rendered ServiceAccount.
		Expect(find(objs, "ServiceAccount", controlPlaneSA).GetNamespace()).To(Equal(installNamespace))
		Expect(vars).To(HaveKeyWithValue("controlPlaneNamespace", "'"+installNamespace+"'"))
		Expect(vars).To(HaveKeyWithValue("controlPlaneAccount", "'"+controlPlaneSA+"'"))

		// Alone, config/policy names the unrendered ServiceAccount.
		alone := &admissionregistrationv1.ValidatingAdmissionPolicy{}
		convert(find(render("config/policy"), "ValidatingAdmissionPolicy", "sandbox-status-writers"), alone)
		for _, v := range alone.Spec.Variables {
			switch v.Name {
			case "managerNamespace":
				Expect(v.Expression).To(Equal("'system'"))
			case "managerAccount":
				Expect(v.Expression).To(Equal("'controller-manager'"))
			}
		}
	})

	It("has a manager policy that is cluster-scoped, fails closed, denies, matches only the rendered manager's updates of the main resource", func() {
		objs := render("config/default")
		vap := &admissionregistrationv1.ValidatingAdmissionPolicy{}
		convert(find(objs, "ValidatingAdmissionPolicy", managerPolicyName), vap)
		binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
		convert(find(objs, "ValidatingAdmissionPolicyBinding", managerPolicyName), binding)

		Expect(vap.Namespace).To(BeEmpty())
		Expect(binding.Namespace).To(BeEmpty())
		Expect(binding.Spec.PolicyName).To(Equal(vap.Name))
		Expect(binding.Spec.ValidationActions).To(Equal([]admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}))
		Expect(binding.Spec.ParamRef).To(BeNil())
		Expect(binding.Spec.MatchResources).To(BeNil())

		Expect(vap.Spec.FailurePolicy).To(HaveValue(Equal(admissionregistrationv1.Fail)))
		Expect(vap.Spec.MatchConstraints.ResourceRules).To(HaveLen(1))
		rule := vap.Spec.MatchConstraints.ResourceRules[0]
		Expect(rule.APIGroups).To(Equal([]string{group}))
		Expect(rule.Operations).To(Equal([]admissionregistrationv1.OperationType{admissionregistrationv1.Update, admissionregistrationv1.Delete}))
		Expect(rule.Resources).To(Equal([]string{"sandboxes"}), "the main resource only; the status has its own policy")
		Expect(vap.Spec.MatchConstraints.ExcludeResourceRules).To(BeEmpty())
		for _, v := range vap.Spec.Validations {
			Expect(v.Reason).To(HaveValue(Equal(metav1.StatusReasonForbidden)), v.Expression)
			Expect(v.MessageExpression).NotTo(BeEmpty(), v.Expression)
		}
		// Only the manager, by its rendered name: users, the MCP server and
		// the webhook are never matched.
		Expect(vap.Spec.MatchConditions).To(Equal([]admissionregistrationv1.MatchCondition{{
			Name:       "manager",
			Expression: "request.userInfo.username == 'system:serviceaccount:' + '" + installNamespace + "' + ':' + '" + managerSA + "'",
		}}))

		// Alone, config/policy names the unrendered ServiceAccount.
		alone := &admissionregistrationv1.ValidatingAdmissionPolicy{}
		convert(find(render("config/policy"), "ValidatingAdmissionPolicy", "sandbox-manager-updates"), alone)
		Expect(alone.Spec.MatchConditions).To(HaveLen(1))
		Expect(alone.Spec.MatchConditions[0].Expression).To(Equal(
			"request.userInfo.username == 'system:serviceaccount:' + 'system' + ':' + 'controller-manager'"))
	})

	It("has a Lease policy that is cluster-scoped, fails closed, denies, matches only the rendered manager's Lease writes", func() {
		objs := render("config/default")
		vap := &admissionregistrationv1.ValidatingAdmissionPolicy{}
		convert(find(objs, "ValidatingAdmissionPolicy", leasePolicyName), vap)
		binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
		convert(find(objs, "ValidatingAdmissionPolicyBinding", leasePolicyName), binding)

		Expect(vap.Namespace).To(BeEmpty())
		Expect(binding.Namespace).To(BeEmpty())
		Expect(binding.Spec.PolicyName).To(Equal(vap.Name))
		Expect(binding.Spec.ValidationActions).To(Equal([]admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}))
		Expect(vap.Spec.FailurePolicy).To(HaveValue(Equal(admissionregistrationv1.Fail)))
		Expect(vap.Spec.MatchConstraints.ResourceRules).To(HaveLen(1))
		rule := vap.Spec.MatchConstraints.ResourceRules[0]
		Expect(rule.APIGroups).To(Equal([]string{"coordination.k8s.io"}))
		Expect(rule.Resources).To(Equal([]string{"leases"}))
		Expect(rule.Operations).To(ConsistOf(admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete))
		Expect(vap.Spec.MatchConditions).To(Equal([]admissionregistrationv1.MatchCondition{{
			Name:       "manager",
			Expression: "request.userInfo.username == 'system:serviceaccount:' + '" + installNamespace + "' + ':' + '" + managerSA + "'",
		}}))
	})
})

// The policy, the CRDs and the RBAC of config/default installed for real,
// with node managers whose tokens are bound to Pods on two nodes, as a
// DaemonSet's are. RBAC lets the manager ServiceAccount write any Sandbox's
// status, so the policy alone decides between the managers.
var _ = Describe("The Sandbox status policy of the default overlay, applied for real", Ordered, func() {
	var (
		ns string
		// Bound to Pods on nodeA and nodeB; not bound to any Pod.
		managerA, managerB, managerUnbound client.Client
		// carol is namespace admin through the built-in admin role (with
		// the shipped roles aggregated into it), erin through the shipped
		// sandbox-admin-role bound directly; dave holds a role that does
		// allow status writes.
		carol, erin, dave client.Client
		// A ServiceAccount named like the manager, in another namespace,
		// with a Pod-bound token and status RBAC.
		impostor client.Client
		// Created unbound in BeforeAll: claimed by nodeA in the specs.
		sbxA = "claimed-by-a"
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
		// envtest runs no kube-controller-manager, so no aggregation
		// controller: fold the shipped roles into admin, edit and view as
		// it would (see aggregate in rbac_test.go).
		aggregate(ctx)

		ns = cp.NewNamespace("policy-")
		cp.Bind(ns, "admin", testenv.UserSubject("carol"))
		cp.Bind(ns, "code-sandbox-sandbox-admin-role", testenv.UserSubject("erin"))
		statusWriter := "policy-test-status-writer"
		cp.CreateClusterRole(statusWriter,
			rbacv1.PolicyRule{APIGroups: []string{group}, Resources: []string{"sandboxes"}, Verbs: []string{"get", "list"}},
			rbacv1.PolicyRule{APIGroups: []string{group}, Resources: []string{"sandboxes/status"}, Verbs: []string{"get", "update", "patch"}})
		cp.Bind(ns, statusWriter, testenv.UserSubject("dave"))
		cp.BindCluster(statusWriter, testenv.ServiceAccountSubject(ns, managerSA))

		carol, erin, dave = impersonate("carol"), impersonate("erin"), impersonate("dave")
		managerA = tokenClient(cp.NodeBoundToken(installNamespace, managerSA, nodeA))
		managerB = tokenClient(cp.NodeBoundToken(installNamespace, managerSA, nodeB))
		impostor = tokenClient(cp.NodeBoundToken(ns, managerSA, nodeA))
		tr, err := cp.Clientset.CoreV1().ServiceAccounts(installNamespace).CreateToken(ctx, managerSA,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		managerUnbound = tokenClient(tr.Status.Token)

		// RBAC lets them all write status, so that only the policy can
		// refuse them.
		for _, s := range []subject{serviceAccount(installNamespace, managerSA), serviceAccount(ns, managerSA), user("dave")} {
			expectAccess(ctx, s, []access{in(ns, "update", "sandboxes/status"), in(ns, "patch", "sandboxes/status")}, nil)
		}
		// The shipped RBAC lets the manager update the main resource of any
		// Sandbox (for its finalizer) and delete any (spec.lifecycle), so
		// that only the manager policy can confine it; it never creates one,
		// nor deletes in bulk, and may not.
		expectAccess(ctx, serviceAccount(installNamespace, managerSA),
			[]access{in(ns, "update", "sandboxes"), in(ns, "patch", "sandboxes"), in(ns, "delete", "sandboxes")},
			[]access{in(ns, "deletecollection", "sandboxes"), in(ns, "create", "sandboxes")})

		Expect(cp.Client.Create(ctx, newSandbox(ns, sbxA, ""))).To(Succeed())
		Expect(cp.Client.Create(ctx, newSandbox(ns, "probe", ""))).To(Succeed())

		// The API server loads policies asynchronously: wait until it
		// refuses even the cluster administrator, and after the specs
		// (cleanups run last first) until it no longer does, so that other
		// specs can write status.
		probe := func(ctx SpecContext) error {
			return patchStatus(ctx, cp.Client, ns, "probe", map[string]any{"containerID": "probe"}, client.DryRunAll)
		}
		// The manager policy refuses a manager token with no node name.
		managerProbe := func(ctx SpecContext) error {
			return patchSandbox(ctx, managerUnbound, ns, "probe", map[string]any{"metadata": map[string]any{"labels": map[string]any{"probe": "x"}}}, client.DryRunAll)
		}
		DeferCleanup(func(ctx SpecContext) {
			Eventually(probe).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
			Eventually(managerProbe).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		})
		Expect(managerProbe(ctx)).To(Succeed(), "refused before the manager policy was installed")
		// The Lease policy refuses a manager token with no node name.
		leaseProbe := func(ctx SpecContext) error {
			return managerUnbound.Create(ctx, lease(leasePrefix+"probe", "probe"), client.DryRunAll)
		}
		DeferCleanup(func(ctx SpecContext) {
			Eventually(leaseProbe).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		})
		Expect(leaseProbe(ctx)).To(Succeed(), "refused before the Lease policy was installed")
		for _, name := range []string{policyName, managerPolicyName, leasePolicyName, controlPlanePolicyName} {
			for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
				o := find(objs, kind, name)
				Expect(applyForReal(ctx, o)).To(Succeed(), describe(o))
				DeferCleanup(func(ctx SpecContext) {
					Expect(client.IgnoreNotFound(cp.Client.Delete(ctx, o))).To(Succeed())
				})
			}
		}
		Eventually(probe).WithContext(ctx).WithTimeout(30 * time.Second).Should(MatchError(ContainSubstring(policyDenied)))
		Eventually(managerProbe).WithContext(ctx).WithTimeout(30 * time.Second).Should(MatchError(ContainSubstring(managerPolicyDenied)))
		Eventually(leaseProbe).WithContext(ctx).WithTimeout(30 * time.Second).Should(MatchError(ContainSubstring(leasePolicyDenied)))
	})

	It("gives the manager Lease writes in the operator namespace only, which the Lease policy then confines", func(ctx SpecContext) {
		expectAccess(ctx, serviceAccount(installNamespace, managerSA),
			[]access{core(coordination, installNamespace, "create", "leases", ""), core(coordination, installNamespace, "update", "leases", ""),
				core(coordination, installNamespace, "delete", "leases", ""), core(coordination, installNamespace, "list", "leases", "")},
			[]access{core(coordination, ns, "create", "leases", ""), core(coordination, "kube-node-lease", "update", "leases", "")})
	})

	It("lets the manager of node A create, renew and delete its own node's Lease", func(ctx SpecContext) {
		own := lease(leasePrefix+nodeA, nodeA)
		Expect(managerA.Create(ctx, own)).To(Succeed())
		own.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		Expect(managerA.Update(ctx, own)).To(Succeed())
		Expect(managerA.Delete(ctx, own)).To(Succeed())
	})

	It("refuses a manager another node's Lease, its own held as another node, and the quota controller's Lease", func(ctx SpecContext) {
		// Node A's Lease, as node A's manager left it.
		own := lease(leasePrefix+nodeA, nodeA)
		Expect(managerA.Create(ctx, own)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(cp.Client.Delete(ctx, own))).To(Succeed()) })
		// The quota controller's leader election Lease in the same namespace.
		leader := lease("code-sandbox-quota-controller", "webhook-pod-1")
		Expect(cp.Client.Create(ctx, leader)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(cp.Client.Delete(ctx, leader))).To(Succeed()) })

		expectLeaseRefusal(managerB.Create(ctx, lease(leasePrefix+nodeA+"-2", nodeB)),
			"the manager of node "+nodeB+" ("+managerUser+") may write only Lease "+leasePrefix+nodeB)
		taken := own.DeepCopy()
		taken.Spec.HolderIdentity = ptr.To(nodeB)
		expectLeaseRefusal(managerB.Update(ctx, taken), "may write only Lease "+leasePrefix+nodeB+", not Lease "+installNamespace+"/"+leasePrefix+nodeA)
		expectLeaseRefusal(managerB.Delete(ctx, own), "may write only Lease "+leasePrefix+nodeB)
		expectLeaseRefusal(managerA.Update(ctx, taken), "the manager of node "+nodeA+" ("+managerUser+") may hold its Lease only as "+nodeA+`, not as "`+nodeB+`"`)
		expectLeaseRefusal(managerB.Create(ctx, lease(leasePrefix+nodeB, nodeA)), "may hold its Lease only as "+nodeB)

		hijack := leader.DeepCopy()
		hijack.Spec.HolderIdentity = ptr.To(nodeA)
		expectLeaseRefusal(managerA.Update(ctx, hijack), "may write only Lease "+leasePrefix+nodeA+", not Lease "+installNamespace+"/code-sandbox-quota-controller")
		expectLeaseRefusal(managerA.Delete(ctx, leader), "may write only Lease "+leasePrefix+nodeA)
		expectLeaseRefusal(managerUnbound.Create(ctx, lease(leasePrefix+nodeA+"-3", nodeA)), "only with a token bound to its Pod")

		// Nothing changed.
		got := &coordinationv1.Lease{}
		Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(leader), got)).To(Succeed())
		Expect(got.Spec.HolderIdentity).To(HaveValue(Equal("webhook-pod-1")))
		Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(own), got)).To(Succeed())
		Expect(got.Spec.HolderIdentity).To(HaveValue(Equal(nodeA)))
	})

	It("gives a Pod-bound manager token the node's name, and an unbound one none", func(ctx SpecContext) {
		for _, tc := range []struct {
			token string
			nodes []string
		}{
			{cp.NodeBoundToken(installNamespace, managerSA, nodeA), []string{nodeA}},
			{cp.NodeBoundToken(installNamespace, managerSA, nodeB), []string{nodeB}},
		} {
			info := whoAmI(ctx, tc.token)
			Expect(info.Username).To(Equal(managerUser))
			Expect(info.Extra).To(HaveKeyWithValue(nodeNameKey, BeEquivalentTo(tc.nodes)))
		}
		tr, err := cp.Clientset.CoreV1().ServiceAccounts(installNamespace).CreateToken(ctx, managerSA,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		info := whoAmI(ctx, tr.Status.Token)
		Expect(info.Username).To(Equal(managerUser))
		Expect(info.Extra).NotTo(HaveKey(nodeNameKey))
	})

	It("leaves namespace admins without RBAC to patch or update status (403 from RBAC, before any policy)", func(ctx SpecContext) {
		for who, c := range map[string]client.Client{"carol (built-in admin)": carol, "erin (sandbox-admin-role)": erin} {
			// They do manage Sandboxes, and may read the status.
			sbx := getSandbox(ctx, c, ns, sbxA)

			err := patchStatus(ctx, c, ns, sbxA, map[string]any{"nodeName": "nowhere"})
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%s: %v", who, err)
			Expect(err).To(MatchError(ContainSubstring(`cannot patch resource "sandboxes/status"`)), who)
			Expect(err).NotTo(MatchError(ContainSubstring("ValidatingAdmissionPolicy")), who)

			Expect(unstructured.SetNestedField(sbx.Object, "nowhere", "status", "nodeName")).To(Succeed())
			err = c.Status().Update(ctx, sbx)
			Expect(err).To(MatchError(ContainSubstring(`cannot update resource "sandboxes/status"`)), who)
		}
		expectAccess(ctx, user("carol"), nil, []access{in(ns, "update", "sandboxes/status"), in(ns, "patch", "sandboxes/status")})
		Expect(nodeOf(ctx, ns, sbxA)).To(BeEmpty())
	})

	It("refuses a user whose role does allow status writes, and the cluster administrator (the policy)", func(ctx SpecContext) {
		err := patchStatus(ctx, dave, ns, sbxA, map[string]any{"nodeName": "nowhere", "conditions": conditions("Ready", "True")})
		expectPolicyRefusal(err, "only the node managers ("+managerUser+") may write the status of Sandbox "+ns+"/"+sbxA+
			", and the control plane (system:serviceaccount:"+installNamespace+":"+controlPlaneSA+") only to mark it NodeLost; dave may not")

		err = patchStatus(ctx, cp.Client, ns, sbxA, map[string]any{"nodeName": "nowhere"})
		expectPolicyRefusal(err, "only the node managers ("+managerUser+") may write the status")
		Expect(nodeOf(ctx, ns, sbxA)).To(BeEmpty())
	})

	It("refuses a ServiceAccount named like the manager in another namespace, even with a Pod-bound token", func(ctx SpecContext) {
		err := patchStatus(ctx, impostor, ns, sbxA, map[string]any{"nodeName": nodeA})
		expectPolicyRefusal(err, "system:serviceaccount:"+ns+":"+managerSA+" may not")
		Expect(nodeOf(ctx, ns, sbxA)).To(BeEmpty())
	})

	It("refuses the manager ServiceAccount with a token not bound to a Pod (no node name)", func(ctx SpecContext) {
		err := patchStatus(ctx, managerUnbound, ns, sbxA, map[string]any{"nodeName": nodeA})
		expectPolicyRefusal(err, managerUser+" may write the status of Sandbox "+ns+"/"+sbxA+" only with a token bound to its Pod")
		Expect(err).To(MatchError(ContainSubstring("this request names 0 nodes")))
		Expect(nodeOf(ctx, ns, sbxA)).To(BeEmpty())
	})

	It("lets a manager report on an unbound Sandbox without claiming it, but claim it only for its own node", func(ctx SpecContext) {
		// What a full node does (Ready=False, Pending): allowed for any node.
		Expect(patchStatus(ctx, managerB, ns, sbxA, map[string]any{"conditions": conditions("Ready", "False")})).To(Succeed())
		err := patchStatus(ctx, managerA, ns, sbxA, map[string]any{"nodeName": nodeB})
		expectPolicyRefusal(err, "the manager of node "+nodeA+" ("+managerUser+") may claim Sandbox "+ns+"/"+sbxA+" only for its own node, not for node "+nodeB)
		Expect(nodeOf(ctx, ns, sbxA)).To(BeEmpty())
	})

	It("lets a manager change only the pending conditions of an unbound Sandbox, unless it claims it for itself", func(ctx SpecContext) {
		name := "unbound-plant"
		Expect(cp.Client.Create(ctx, newSandbox(ns, name, ""))).To(Succeed())
		// What a compromised manager of node A would plant for node B to
		// find when it claims: another Sandbox's container, a far-future
		// start (no deadline), an endpoint, a verdict the quota believes.
		refused := map[string]map[string]any{
			"a container ID":        {"containerID": "0123456789ab"},
			"a far-future start":    {"startTime": "2999-01-01T00:00:00Z"},
			"a warm pool member":    {"warmPool": map[string]any{"member": map[string]any{"name": "victim", "uid": "5f0c2f3e-0000-4000-8000-000000000001"}}},
			"a node API endpoint":   {"nodeAPIEndpoint": "https://203.0.113.7:9443"},
			"an observedGeneration": {"observedGeneration": int64(7)},
		}
		for what, status := range refused {
			status["conditions"] = conditions("Ready", "False")
			err := patchStatus(ctx, managerA, ns, name, status)
			expectPolicyRefusal(err, "the manager of node "+nodeA+" ("+managerUser+") may change only the conditions of Sandbox "+ns+"/"+name+" unless it claims it for its own node")
			Expect(err).To(HaveOccurred(), what)
		}
		for _, conds := range [][]any{
			append(conditions("Ready", "False"), conditions("Expired", "True")...),
			conditions("Ready", "True"),
			conditions("Paused", "False"),
		} {
			err := patchStatus(ctx, managerB, ns, name, map[string]any{"conditions": conds})
			expectPolicyRefusal(err, "may write only a Ready condition that is not True to Sandbox "+ns+"/"+name+", which is bound to no node")
		}
		sbx := getSandbox(ctx, cp.Client, ns, name)
		Expect(sbx.Object).NotTo(HaveKey("status"))

		// The pending condition is what a full node writes: allowed.
		Expect(patchStatus(ctx, managerA, ns, name, map[string]any{"conditions": conditions("Ready", "False")})).To(Succeed())
		Expect(condition(getSandbox(ctx, cp.Client, ns, name), "Ready")).To(Equal("False"))
		// A write that binds the Sandbox to the writer's own node may set
		// anything: the node is its own.
		Expect(patchStatus(ctx, managerB, ns, name, map[string]any{
			"nodeName": nodeB, "containerID": "0123456789ab", "startTime": "2026-01-01T00:00:00Z",
			"nodeAPIEndpoint": "https://203.0.113.7:9443", "conditions": conditions("Ready", "False"),
		})).To(Succeed())
		Expect(nodeOf(ctx, ns, name)).To(Equal(nodeB))
	})

	It("lets the manager of node A claim an unbound Sandbox", func(ctx SpecContext) {
		Expect(patchStatus(ctx, managerA, ns, sbxA, map[string]any{
			"nodeName": nodeA, "conditions": conditions("Ready", "False"),
		})).To(Succeed())
		Expect(nodeOf(ctx, ns, sbxA)).To(Equal(nodeA))
	})

	It("refuses the manager of node B any status write to node A's Sandbox, claims included", func(ctx SpecContext) {
		for _, status := range []map[string]any{
			{"conditions": conditions("Ready", "False")},
			{"nodeName": nodeB},
			{"nodeAPIEndpoint": "https://203.0.113.7:9443"},
		} {
			err := patchStatus(ctx, managerB, ns, sbxA, status)
			expectPolicyRefusal(err, "the manager of node "+nodeB+" ("+managerUser+") may not write the status of Sandbox "+ns+"/"+sbxA+", which is bound to node "+nodeA)
		}
		Expect(nodeOf(ctx, ns, sbxA)).To(Equal(nodeA))
	})

	It("refuses the manager of node A rebinding its Sandbox to node B, or unbinding it", func(ctx SpecContext) {
		err := patchStatus(ctx, managerA, ns, sbxA, map[string]any{"nodeName": nodeB})
		expectPolicyRefusal(err, "may not rebind Sandbox "+ns+"/"+sbxA+" from node "+nodeA+" to node "+nodeB)
		err = patchStatus(ctx, managerA, ns, sbxA, map[string]any{"nodeName": nil})
		expectPolicyRefusal(err, "may not rebind Sandbox "+ns+"/"+sbxA+" from node "+nodeA+" to no node")
		Expect(nodeOf(ctx, ns, sbxA)).To(Equal(nodeA))
	})

	It("lets the manager of node A update its Sandbox's status, with PATCH and with PUT", func(ctx SpecContext) {
		Expect(patchStatus(ctx, managerA, ns, sbxA, map[string]any{"conditions": conditions("Ready", "True")})).To(Succeed())
		sbx := getSandbox(ctx, managerA, ns, sbxA)
		Expect(unstructured.SetNestedField(sbx.Object, "container-1", "status", "containerID")).To(Succeed())
		Expect(managerA.Status().Update(ctx, sbx)).To(Succeed())
		sbx = getSandbox(ctx, cp.Client, ns, sbxA)
		Expect(sbx.Object).To(HaveKeyWithValue("status", And(
			HaveKeyWithValue("containerID", "container-1"),
			HaveKeyWithValue("nodeName", nodeA))))
		Expect(condition(sbx, "Ready")).To(Equal("True"))
	})

	It("refuses a forged Expired=True from anyone but node A's manager", func(ctx SpecContext) {
		expired := map[string]any{"conditions": append(conditions("Ready", "False"), conditions("Expired", "True")...)}
		expectPolicyRefusal(patchStatus(ctx, dave, ns, sbxA, expired), "dave may not")
		expectPolicyRefusal(patchStatus(ctx, cp.Client, ns, sbxA, expired), "only the node managers")
		expectPolicyRefusal(patchStatus(ctx, managerUnbound, ns, sbxA, expired), "only with a token bound to its Pod")
		expectPolicyRefusal(patchStatus(ctx, impostor, ns, sbxA, expired), "system:serviceaccount:"+ns+":"+managerSA+" may not")
		expectPolicyRefusal(patchStatus(ctx, managerB, ns, sbxA, expired), "which is bound to node "+nodeA)
		sbx := getSandbox(ctx, cp.Client, ns, sbxA)
		Expect(condition(sbx, "Expired")).To(BeEmpty())
		Expect(condition(sbx, "Ready")).To(Equal("True"))
		// The node's own manager does expire it.
		Expect(patchStatus(ctx, managerA, ns, sbxA, expired)).To(Succeed())
		Expect(condition(getSandbox(ctx, cp.Client, ns, sbxA), "Expired")).To(Equal("True"))
	})

	It("lets the control plane mark a bound Sandbox NodeLost and write nothing else; NodeLost is then frozen for everyone", func(ctx SpecContext) {
		controlPlane := tokenClient(cp.NodeBoundToken(installNamespace, controlPlaneSA, nodeB))
		expectAccess(ctx, serviceAccount(installNamespace, controlPlaneSA), []access{in(ns, "patch", "sandboxes/status")}, nil)
		const lostName = "lost-on-a"
		Expect(cp.Client.Create(ctx, newSandbox(ns, lostName, ""))).To(Succeed())

		// Unbound: nothing to lose.
		expectPolicyRefusal(patchStatus(ctx, controlPlane, ns, lostName, map[string]any{"conditions": nodeLost()}),
			"may only mark Sandbox "+ns+"/"+lostName+" NodeLost")
		paused := conditions("Paused", "False")
		Expect(patchStatus(ctx, managerA, ns, lostName, map[string]any{"nodeName": nodeA, "containerID": "c-1",
			"conditions": append(conditions("Ready", "True"), paused...)})).To(Succeed())

		// Anything but NodeLost, or NodeLost with anything else, is refused.
		for what, status := range map[string]map[string]any{
			"Ready=True":               {"conditions": conditions("Ready", "True")},
			"Expired=True":             {"conditions": append(conditions("Ready", "True"), conditions("Expired", "True")...)},
			"NodeLost and Expired":     {"conditions": append(nodeLost(), append(paused, conditions("Expired", "True")...)...)},
			"NodeLost, Paused dropped": {"conditions": nodeLost()},
			"NodeLost and unbinding":   {"conditions": nodeLost(), "nodeName": nil},
			"NodeLost and rebinding":   {"conditions": nodeLost(), "nodeName": nodeB},
			"NodeLost and a container": {"conditions": nodeLost(), "containerID": "c-2"},
			"NodeLost and an endpoint": {"conditions": nodeLost(), "nodeAPIEndpoint": "https://attacker:9443"},
		} {
			expectPolicyRefusal(patchStatus(ctx, controlPlane, ns, lostName, status), "may only mark Sandbox "+ns+"/"+lostName+" NodeLost")
			Expect(condition(getSandbox(ctx, cp.Client, ns, lostName), "Ready")).To(Equal("True"), what)
		}

		// A manager may not write NodeLost, on its own node or another's;
		// nor may a namespace user or the cluster administrator.
		expectPolicyRefusal(patchStatus(ctx, managerA, ns, lostName, map[string]any{"conditions": nodeLost()}),
			"only the control plane decides that a node is lost")
		expectPolicyRefusal(patchStatus(ctx, managerB, ns, lostName, map[string]any{"conditions": nodeLost()}),
			"which is bound to node "+nodeA)
		expectPolicyRefusal(patchStatus(ctx, dave, ns, lostName, map[string]any{"conditions": nodeLost()}), "dave may not")
		expectPolicyRefusal(patchStatus(ctx, cp.Client, ns, lostName, map[string]any{"conditions": nodeLost()}), "only the node managers")
		expectPolicyRefusal(patchStatus(ctx, impostor, ns, lostName, map[string]any{"conditions": nodeLost()}),
			"system:serviceaccount:"+ns+":"+managerSA+" may not")

		// The control plane does, keeping every other condition as it was.
		Expect(patchStatus(ctx, controlPlane, ns, lostName, map[string]any{"conditions": append(nodeLost(), paused...)})).To(Succeed())
		lost := getSandbox(ctx, cp.Client, ns, lostName)
		Expect(condition(lost, "Ready")).To(Equal("False"))
		Expect(lost.Object["status"]).To(And(HaveKeyWithValue("nodeName", nodeA), HaveKeyWithValue("containerID", "c-1")))

		// Terminal: the returning manager cannot flip it back, nor change
		// anything else; the control plane cannot write again.
		expectPolicyRefusal(patchStatus(ctx, managerA, ns, lostName, map[string]any{"conditions": conditions("Ready", "True")}),
			"is NodeLost")
		expectPolicyRefusal(patchStatus(ctx, managerA, ns, lostName, map[string]any{"containerID": "c-3"}), "is NodeLost")
		expectPolicyRefusal(patchStatus(ctx, controlPlane, ns, lostName, map[string]any{"conditions": conditions("Ready", "True")}),
			"may only mark")
		Expect(condition(getSandbox(ctx, cp.Client, ns, lostName), "Ready")).To(Equal("False"))
		// Writing the same status again changes nothing and is allowed.
		Expect(managerA.Status().Update(ctx, getSandbox(ctx, managerA, ns, lostName))).To(Succeed())
		Expect(cp.Client.Delete(ctx, sandboxRef(ns, lostName))).To(Succeed())
	})

	It("lets the control plane only release the manager's finalizer of a Sandbox being deleted", func(ctx SpecContext) {
		controlPlane := tokenClient(cp.NodeBoundToken(installNamespace, controlPlaneSA, nodeB))
		expectAccess(ctx, serviceAccount(installNamespace, controlPlaneSA), []access{in(ns, "patch", "sandboxes")}, nil)
		const name = "released-by-control-plane"
		const other = "example.com/other"
		sbx := newSandbox(ns, name, "")
		sbx.SetFinalizers([]string{managerFinalizer, other})
		Expect(cp.Client.Create(ctx, sbx)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			_ = patchSandbox(ctx, cp.Client, ns, name, map[string]any{"metadata": map[string]any{"finalizers": nil}})
		})
		refused := func(err error, message string) {
			GinkgoHelper()
			Expect(err).To(HaveOccurred(), "the control-plane policy should have refused this")
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "403 Forbidden expected: %v", err)
			Expect(err).To(MatchError(ContainSubstring(controlPlanePolicyDenied)))
			Expect(err).To(MatchError(ContainSubstring(message)))
		}
		release := map[string]any{"metadata": map[string]any{"finalizers": []any{other}}}

		// Not being deleted: nothing at all (the policy loads asynchronously).
		Eventually(func(ctx SpecContext) error {
			return patchSandbox(ctx, controlPlane, ns, name, release, client.DryRunAll)
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(MatchError(ContainSubstring(controlPlanePolicyDenied)))
		refused(patchSandbox(ctx, controlPlane, ns, name, release), "only to release the finalizer of the node manager once its deletion has started")

		Expect(cp.Client.Delete(ctx, sandboxRef(ns, name))).To(Succeed())
		refused(patchSandbox(ctx, controlPlane, ns, name, map[string]any{"metadata": map[string]any{"labels": map[string]any{"x": "y"}}}),
			"may change only the finalizers of Sandbox "+ns+"/"+name)
		refused(patchSandbox(ctx, controlPlane, ns, name, map[string]any{"spec": map[string]any{"activeDeadlineSeconds": int64(60)}}),
			"may change only the finalizers")
		refused(patchSandbox(ctx, controlPlane, ns, name, map[string]any{"metadata": map[string]any{"finalizers": []any{managerFinalizer}}}),
			"may only remove the finalizer sandbox.code-sandbox.dev/container")
		Expect(getSandbox(ctx, cp.Client, ns, name).GetFinalizers()).To(ConsistOf(managerFinalizer, other))

		Expect(patchSandbox(ctx, controlPlane, ns, name, release)).To(Succeed())
		Expect(getSandbox(ctx, cp.Client, ns, name).GetFinalizers()).To(ConsistOf(other))
	})

	It("keeps a Sandbox pinned by spec.nodeName from other nodes' managers", func(ctx SpecContext) {
		Expect(cp.Client.Create(ctx, newSandbox(ns, "pinned-to-b", nodeB))).To(Succeed())
		err := patchStatus(ctx, managerA, ns, "pinned-to-b", map[string]any{"nodeName": nodeA})
		expectPolicyRefusal(err, "which spec.nodeName pins to node "+nodeB)
		err = patchStatus(ctx, managerA, ns, "pinned-to-b", map[string]any{"conditions": conditions("Ready", "False")})
		expectPolicyRefusal(err, "which spec.nodeName pins to node "+nodeB)
		Expect(patchStatus(ctx, managerB, ns, "pinned-to-b", map[string]any{"nodeName": nodeB})).To(Succeed())
	})

	It("refuses the manager of node B any change to node A's Sandbox: finalizers, labels, activeDeadlineSeconds", func(ctx SpecContext) {
		before := getSandbox(ctx, cp.Client, ns, sbxA)
		refused := "the manager of node " + nodeB + " (" + managerUser + ") may not change Sandbox " + ns + "/" + sbxA + ", which is bound to node " + nodeA
		for _, patch := range []map[string]any{
			{"metadata": map[string]any{"finalizers": []any{managerFinalizer}}},
			{"metadata": map[string]any{"labels": map[string]any{"stolen-by": nodeB}}},
			{"metadata": map[string]any{"annotations": map[string]any{"stolen-by": nodeB}}},
			{"spec": map[string]any{"activeDeadlineSeconds": int64(1)}},
		} {
			expectManagerPolicyRefusal(patchSandbox(ctx, managerB, ns, sbxA, patch), refused)
		}
		// With PUT, as the manager's controller writes.
		sbx := getSandbox(ctx, managerB, ns, sbxA)
		sbx.SetFinalizers([]string{managerFinalizer})
		expectManagerPolicyRefusal(managerB.Update(ctx, sbx), refused)
		expectUnchanged(ctx, ns, sbxA, before)
	})

	It("refuses the manager of node A any change to its own Sandbox but its finalizers", func(ctx SpecContext) {
		before := getSandbox(ctx, cp.Client, ns, sbxA)
		refused := "the manager of node " + nodeA + " (" + managerUser + ") may change only the finalizers of Sandbox " + ns + "/" + sbxA + ", not its "
		for patch, what := range map[string]string{
			`{"metadata":{"labels":{"team":"node-a"}}}`:                                                                                             "labels",
			`{"metadata":{"annotations":{"note":"node-a"}}}`:                                                                                        "annotations",
			`{"spec":{"activeDeadlineSeconds":1}}`:                                                                                                  "spec",
			`{"spec":{"activeDeadlineSeconds":null}}`:                                                                                               "spec",
			`{"metadata":{"finalizers":["` + managerFinalizer + `"],"labels":{"team":"a"}}}`:                                                        "labels",
			`{"metadata":{"labels":{"team":"a"},"annotations":{"a":"b"}},"spec":{"activeDeadlineSeconds":7}}`:                                       "spec, labels, annotations",
			`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"owner","uid":"00000000-0000-0000-0000-000000000001"}]}}`: "ownerReferences",
		} {
			err := managerA.Patch(ctx, sandboxRef(ns, sbxA), client.RawPatch(types.MergePatchType, []byte(patch)))
			expectManagerPolicyRefusal(err, refused+what)
			Expect(err.Error()).To(HaveSuffix(refused+what), patch)
		}
		sbx := getSandbox(ctx, managerA, ns, sbxA)
		sbx.SetLabels(map[string]string{"team": "node-a"})
		expectManagerPolicyRefusal(managerA.Update(ctx, sbx), refused+"labels")
		expectUnchanged(ctx, ns, sbxA, before)

		// The same manager without its Pod-bound token (no node name).
		expectManagerPolicyRefusal(patchSandbox(ctx, managerUnbound, ns, sbxA,
			map[string]any{"metadata": map[string]any{"finalizers": []any{managerFinalizer}}}),
			managerUser+" may change Sandbox "+ns+"/"+sbxA+" only with a token bound to its Pod")
		// A Sandbox no node has claimed yet: a manager claims through the
		// status first, then adds its finalizer.
		Expect(cp.Client.Create(ctx, newSandbox(ns, "unclaimed", ""))).To(Succeed())
		expectManagerPolicyRefusal(patchSandbox(ctx, managerA, ns, "unclaimed",
			map[string]any{"metadata": map[string]any{"finalizers": []any{managerFinalizer}}}),
			"the manager of node "+nodeA+" ("+managerUser+") may not change Sandbox "+ns+"/unclaimed, which is not bound to any node")
		Expect(getSandbox(ctx, cp.Client, ns, "unclaimed").GetFinalizers()).To(BeEmpty())
	})

	It("lets a manager delete only its own node's Sandboxes, and only those whose lifecycle asks for it", func(ctx SpecContext) {
		create := func(name string, lifecycle map[string]any) {
			sbx := newSandbox(ns, name, "")
			if lifecycle != nil {
				sbx.Object["spec"].(map[string]any)["lifecycle"] = lifecycle
			}
			Expect(cp.Client.Create(ctx, sbx)).To(Succeed())
			Expect(patchStatus(ctx, managerA, ns, name, map[string]any{"nodeName": nodeA})).To(Succeed())
		}
		create("idle-delete", map[string]any{"idleDeleteSeconds": int64(60)})
		create("shutdown-delete", map[string]any{"shutdownPolicy": "Delete"})
		create("retained", map[string]any{"idlePauseSeconds": int64(60), "shutdownPolicy": "Retain"})
		create("no-lifecycle", nil)

		// Node B's manager may delete none of node A's, whatever they ask.
		expectManagerPolicyRefusal(managerB.Delete(ctx, sandboxRef(ns, "idle-delete")),
			"the manager of node "+nodeB+" ("+managerUser+") may not delete Sandbox "+ns+"/idle-delete, which is bound to node "+nodeA)
		expectManagerPolicyRefusal(managerUnbound.Delete(ctx, sandboxRef(ns, "idle-delete")), "only with a token bound to its Pod")
		// Node A's manager may not delete those that did not ask.
		for _, name := range []string{"retained", "no-lifecycle"} {
			expectManagerPolicyRefusal(managerA.Delete(ctx, sandboxRef(ns, name)),
				"may delete Sandbox "+ns+"/"+name+" only when its spec.lifecycle asks for it")
		}
		// Nor an unbound one.
		Expect(cp.Client.Create(ctx, newSandbox(ns, "unbound-delete", ""))).To(Succeed())
		expectManagerPolicyRefusal(managerA.Delete(ctx, sandboxRef(ns, "unbound-delete")), "which is not bound to any node")
		for _, name := range []string{"retained", "no-lifecycle", "unbound-delete"} {
			Expect(getSandbox(ctx, cp.Client, ns, name).GetDeletionTimestamp()).To(BeNil(), name)
		}
		// The two that asked.
		Expect(managerA.Delete(ctx, sandboxRef(ns, "idle-delete"))).To(Succeed())
		Expect(managerA.Delete(ctx, sandboxRef(ns, "shutdown-delete"))).To(Succeed())
	})

	It("lets only node A's manager write status.lastActivityTime of its Sandbox", func(ctx SpecContext) {
		Expect(cp.Client.Create(ctx, newSandbox(ns, "activity", ""))).To(Succeed())
		Expect(patchStatus(ctx, managerA, ns, "activity", map[string]any{"nodeName": nodeA})).To(Succeed())
		at := map[string]any{"lastActivityTime": "2026-01-02T03:04:05Z"}
		Expect(patchStatus(ctx, managerA, ns, "activity", at)).To(Succeed())
		later := map[string]any{"lastActivityTime": "2030-01-02T03:04:05Z"}
		expectPolicyRefusal(patchStatus(ctx, managerB, ns, "activity", later), "which is bound to node "+nodeA)
		expectPolicyRefusal(patchStatus(ctx, dave, ns, "activity", later), "dave may not")
		expectPolicyRefusal(patchStatus(ctx, cp.Client, ns, "activity", later), "may not")
		Expect(getSandbox(ctx, cp.Client, ns, "activity").Object).To(HaveKeyWithValue("status",
			HaveKeyWithValue("lastActivityTime", "2026-01-02T03:04:05Z")))
	})

	It("leaves users alone: the namespace admin labels, annotates and extends their Sandbox, and manages finalizers", func(ctx SpecContext) {
		Expect(patchSandbox(ctx, carol, ns, sbxA, map[string]any{
			"metadata": map[string]any{
				"labels":      map[string]any{"team": "carol"},
				"annotations": map[string]any{"note": "by carol"},
				"finalizers":  []any{"example.com/carol"},
			},
			"spec": map[string]any{"activeDeadlineSeconds": int64(7200)},
		})).To(Succeed())
		sbx := getSandbox(ctx, cp.Client, ns, sbxA)
		Expect(sbx.GetLabels()).To(HaveKeyWithValue("team", "carol"))
		Expect(sbx.GetAnnotations()).To(HaveKeyWithValue("note", "by carol"))
		Expect(sbx.GetFinalizers()).To(ConsistOf("example.com/carol"))
		Expect(sbx.Object).To(HaveKeyWithValue("spec", HaveKeyWithValue("activeDeadlineSeconds", BeNumerically("==", 7200))))
		// With PUT too.
		sbx = getSandbox(ctx, carol, ns, sbxA)
		sbx.SetFinalizers(nil)
		Expect(unstructured.SetNestedField(sbx.Object, int64(3600), "spec", "activeDeadlineSeconds")).To(Succeed())
		Expect(carol.Update(ctx, sbx)).To(Succeed())
		sbx = getSandbox(ctx, cp.Client, ns, sbxA)
		Expect(sbx.GetFinalizers()).To(BeEmpty())
		Expect(sbx.Object).To(HaveKeyWithValue("spec", HaveKeyWithValue("activeDeadlineSeconds", BeNumerically("==", 3600))))
	})

	It("drops a status that a user sends when creating a Sandbox", func(ctx SpecContext) {
		sbx := newSandbox(ns, "created-with-status", "")
		sbx.Object["status"] = map[string]any{"nodeName": "nowhere", "conditions": conditions("Expired", "True")}
		Expect(carol.Create(ctx, sbx)).To(Succeed())
		got := getSandbox(ctx, cp.Client, ns, "created-with-status")
		Expect(got.Object).NotTo(HaveKey("status"))
	})

	It("never stands in the way of finalizers or deletion", func(ctx SpecContext) {
		// The manager adds its finalizer to the Sandbox it claimed (a
		// main-resource update, with PUT as the controller writes it), and
		// may take it off and put it back with a PATCH.
		sbx := getSandbox(ctx, managerA, ns, sbxA)
		Expect(sbx.GetLabels()).To(HaveKeyWithValue("team", "carol"), "labels set by a user stay as they are")
		sbx.SetFinalizers(append(sbx.GetFinalizers(), managerFinalizer))
		Expect(managerA.Update(ctx, sbx)).To(Succeed())
		Expect(patchSandbox(ctx, managerA, ns, sbxA, map[string]any{"metadata": map[string]any{"finalizers": nil}})).To(Succeed())
		Expect(patchSandbox(ctx, managerA, ns, sbxA, map[string]any{"metadata": map[string]any{"finalizers": []any{managerFinalizer}}})).To(Succeed())
		Expect(getSandbox(ctx, cp.Client, ns, sbxA).GetFinalizers()).To(ConsistOf(managerFinalizer))

		// The namespace admin deletes it; the manager reports and removes
		// the finalizer. Another node's manager cannot remove it, and the
		// manager itself can change nothing else meanwhile.
		Expect(carol.Delete(ctx, getSandbox(ctx, carol, ns, sbxA))).To(Succeed())
		sbx = getSandbox(ctx, managerA, ns, sbxA)
		Expect(sbx.GetDeletionTimestamp()).NotTo(BeNil())
		Expect(patchStatus(ctx, managerA, ns, sbxA, map[string]any{"conditions": conditions("Ready", "False")})).To(Succeed())
		sbx = getSandbox(ctx, managerB, ns, sbxA)
		sbx.SetFinalizers(nil)
		expectManagerPolicyRefusal(managerB.Update(ctx, sbx), "which is bound to node "+nodeA)
		sbx = getSandbox(ctx, managerA, ns, sbxA)
		sbx.SetFinalizers(nil)
		sbx.SetLabels(nil)
		expectManagerPolicyRefusal(managerA.Update(ctx, sbx), "may change only the finalizers of Sandbox "+ns+"/"+sbxA+", not its labels")
		Expect(getSandbox(ctx, cp.Client, ns, sbxA).GetFinalizers()).To(ConsistOf(managerFinalizer))
		sbx = getSandbox(ctx, managerA, ns, sbxA)
		sbx.SetFinalizers(nil)
		Expect(managerA.Update(ctx, sbx)).To(Succeed())
		Eventually(func(ctx SpecContext) bool {
			return apierrors.IsNotFound(cp.Client.Get(ctx, client.ObjectKeyFromObject(sbx), &unstructured.Unstructured{Object: sandboxTypeMeta()}))
		}).WithContext(ctx).WithTimeout(10 * time.Second).Should(BeTrue())

		// Deleting one without a finalizer is immediate, for a user too.
		Expect(carol.Delete(ctx, getSandbox(ctx, carol, ns, "pinned-to-b"))).To(Succeed())
		Expect(apierrors.IsNotFound(cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pinned-to-b"},
			&unstructured.Unstructured{Object: sandboxTypeMeta()}))).To(BeTrue())
	})
})

// sandboxTypeMeta is the apiVersion and kind of a Sandbox, for unstructured
// objects; these specs use no typed Sandbox, so that they test the CRD as
// rendered and the policy's field names, not the Go types.
func sandboxTypeMeta() map[string]any {
	return map[string]any{"apiVersion": group + "/v1alpha1", "kind": "Sandbox"}
}

// newSandbox is a Sandbox in ns, pinned to node unless it is "".
func newSandbox(ns, name, node string) *unstructured.Unstructured {
	spec := map[string]any{"image": "python:3.12-slim-bookworm", "activeDeadlineSeconds": int64(3600)}
	if node != "" {
		spec["nodeName"] = node
	}
	u := &unstructured.Unstructured{Object: sandboxTypeMeta()}
	u.SetNamespace(ns)
	u.SetName(name)
	u.Object["spec"] = spec
	return u
}

func getSandbox(ctx SpecContext, c client.Client, ns, name string) *unstructured.Unstructured {
	GinkgoHelper()
	u := &unstructured.Unstructured{Object: sandboxTypeMeta()}
	Expect(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, u)).To(Succeed())
	return u
}

// nodeOf is status.nodeName of Sandbox ns/name, as the API server stores it.
func nodeOf(ctx SpecContext, ns, name string) string {
	GinkgoHelper()
	node, _, _ := unstructured.NestedString(getSandbox(ctx, cp.Client, ns, name).Object, "status", "nodeName")
	return node
}

// condition is the status of condition type t, or "".
func condition(u *unstructured.Unstructured, t string) string {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == t {
			s, _ := m["status"].(string)
			return s
		}
	}
	return ""
}

// conditions is a status.conditions list with one condition.
func conditions(t, status string) []any {
	return []any{map[string]any{
		"type": t, "status": status, "reason": "Test", "message": "written by " + CurrentSpecReport().LeafNodeText,
		"lastTransitionTime": metav1.Now().UTC().Format(time.RFC3339),
	}}
}

// nodeLost is a status.conditions list with Ready=False, reason NodeLost.
func nodeLost() []any {
	return []any{map[string]any{
		"type": "Ready", "status": "False", "reason": "NodeLost", "message": "node " + nodeA + " is lost",
		"lastTransitionTime": metav1.Now().UTC().Format(time.RFC3339),
	}}
}

// patchStatus sends a JSON merge patch of status to the status subresource
// of Sandbox ns/name as c's user.
func patchStatus(ctx SpecContext, c client.Client, ns, name string, status map[string]any, opts ...client.SubResourcePatchOption) error {
	data, err := json.Marshal(map[string]any{"status": status})
	Expect(err).NotTo(HaveOccurred())
	u := &unstructured.Unstructured{Object: sandboxTypeMeta()}
	u.SetNamespace(ns)
	u.SetName(name)
	return c.Status().Patch(ctx, u, client.RawPatch(types.MergePatchType, data), opts...)
}

// patchSandbox sends patch as a JSON merge patch of the main resource of
// Sandbox ns/name as c's user.
func patchSandbox(ctx SpecContext, c client.Client, ns, name string, patch map[string]any, opts ...client.PatchOption) error {
	data, err := json.Marshal(patch)
	Expect(err).NotTo(HaveOccurred())
	return c.Patch(ctx, sandboxRef(ns, name), client.RawPatch(types.MergePatchType, data), opts...)
}

// sandboxRef is an unstructured Sandbox that names ns/name and nothing else.
func sandboxRef(ns, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: sandboxTypeMeta()}
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

// expectUnchanged checks that Sandbox ns/name has the labels, annotations,
// finalizers and spec it had in before.
func expectUnchanged(ctx SpecContext, ns, name string, before *unstructured.Unstructured) {
	GinkgoHelper()
	after := getSandbox(ctx, cp.Client, ns, name)
	Expect(after.GetLabels()).To(Equal(before.GetLabels()))
	Expect(after.GetAnnotations()).To(Equal(before.GetAnnotations()))
	Expect(after.GetFinalizers()).To(Equal(before.GetFinalizers()))
	Expect(after.GetOwnerReferences()).To(Equal(before.GetOwnerReferences()))
	Expect(after.Object["spec"]).To(Equal(before.Object["spec"]))
}

// expectManagerPolicyRefusal checks that err is the manager policy's 403
// with message.
func expectManagerPolicyRefusal(err error, message string) {
	GinkgoHelper()
	Expect(err).To(HaveOccurred(), "the manager policy should have refused this")
	Expect(apierrors.IsForbidden(err)).To(BeTrue(), "403 Forbidden expected: %v", err)
	Expect(err).To(MatchError(ContainSubstring(managerPolicyDenied)))
	Expect(err).To(MatchError(ContainSubstring(message)))
}

// expectPolicyRefusal checks that err is the policy's 403 with message.
func expectPolicyRefusal(err error, message string) {
	GinkgoHelper()
	Expect(err).To(HaveOccurred(), "the policy should have refused this")
	Expect(apierrors.IsForbidden(err)).To(BeTrue(), "403 Forbidden expected: %v", err)
	Expect(err).To(MatchError(ContainSubstring(policyDenied)))
	Expect(err).To(MatchError(ContainSubstring(message)))
}

// lease is a Lease in the operator namespace held by holder.
func lease(name, holder string) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: installNamespace, Name: name},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime: &metav1.MicroTime{Time: time.Now()},
		},
	}
}

// expectLeaseRefusal checks that err is the Lease policy's 403 with message.
func expectLeaseRefusal(err error, message string) {
	GinkgoHelper()
	Expect(err).To(HaveOccurred(), "the Lease policy should have refused this")
	Expect(apierrors.IsForbidden(err)).To(BeTrue(), "403 Forbidden expected: %v", err)
	Expect(err).To(MatchError(ContainSubstring(leasePolicyDenied)))
	Expect(err).To(MatchError(ContainSubstring(message)))
}

// impersonate is a client acting as user name (authenticated, no groups
// beyond that and no extras).
func impersonate(name string) client.Client {
	GinkgoHelper()
	cfg := rest.CopyConfig(cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: name, Groups: []string{"system:authenticated"}}
	c, err := client.New(cfg, client.Options{Scheme: cp.Scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// tokenClient is a client that authenticates with token alone.
func tokenClient(token string) client.Client {
	GinkgoHelper()
	c, err := client.New(cp.ConfigForToken(token), client.Options{Scheme: cp.Scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// whoAmI asks the API server who token is (kubectl auth whoami).
func whoAmI(ctx SpecContext, token string) authenticationv1.UserInfo {
	GinkgoHelper()
	cs, err := kubernetes.NewForConfig(cp.ConfigForToken(token))
	Expect(err).NotTo(HaveOccurred())
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	return review.Status.UserInfo
}
