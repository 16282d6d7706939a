/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package manifests

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

const group = "sandbox.code-sandbox.dev"

// access is one question to the API server's authorizer.
type access struct {
	verb, resource, subresource, namespace, name string
	apiGroup                                     *string
}

func (a access) String() string {
	r := a.resource
	if a.subresource != "" {
		r += "/" + a.subresource
	}
	if a.name != "" {
		r += " " + a.name
	}
	if a.namespace != "" {
		r += " in " + a.namespace
	}
	return a.verb + " " + r
}

// in builds an access to a resource of the Sandbox API group.
func in(ns, verb, resource string) access {
	a := access{verb: verb, resource: resource, namespace: ns}
	if r, sub, ok := strings.Cut(resource, "/"); ok {
		a.resource, a.subresource = r, sub
	}
	return a
}

// agg builds an access to a Sandbox subresource in the aggregated API
// group, which kube-apiserver checks before it proxies to the operator.
func agg(ns, verb, resource string) access {
	a := in(ns, verb, resource)
	g := "subresources.sandbox.code-sandbox.dev"
	a.apiGroup = &g
	return a
}

// core builds an access to a resource of another API group.
func core(apiGroup, ns, verb, resource, name string) access {
	return access{verb: verb, resource: resource, namespace: ns, name: name, apiGroup: &apiGroup}
}

// subject is who asks.
type subject struct {
	user   string
	groups []string
}

func user(name string) subject { return subject{user: name, groups: []string{"system:authenticated"}} }

func serviceAccount(ns, name string) subject {
	return subject{
		user:   "system:serviceaccount:" + ns + ":" + name,
		groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
}

// may asks a SubjectAccessReview whether s may do a.
func may(ctx context.Context, s subject, a access) bool {
	GinkgoHelper()
	apiGroup := group
	if a.apiGroup != nil {
		apiGroup = *a.apiGroup
	}
	sar, err := cp.Clientset.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   s.user,
			Groups: s.groups,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: a.namespace, Verb: a.verb, Group: apiGroup,
				Resource: a.resource, Subresource: a.subresource, Name: a.name,
			},
		},
	}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	return sar.Status.Allowed
}

// expectAccess checks every access of allowed and denied for s; the RBAC
// authorizer works from informers, so it waits for new bindings to show.
func expectAccess(ctx context.Context, s subject, allowed, denied []access) {
	GinkgoHelper()
	for _, a := range allowed {
		Eventually(func(ctx context.Context) bool { return may(ctx, s, a) }).WithContext(ctx).
			WithTimeout(10*time.Second).Should(BeTrue(), "%s should be allowed to %s", s.user, a)
	}
	for _, a := range denied {
		Consistently(func(ctx context.Context) bool { return may(ctx, s, a) }).WithContext(ctx).
			WithTimeout(300*time.Millisecond).Should(BeFalse(), "%s should NOT be allowed to %s", s.user, a)
	}
}

// aggregate does what kube-controller-manager's clusterrole-aggregation
// controller does, which envtest does not run (it starts only etcd and
// kube-apiserver): it sets the rules of each built-in ClusterRole with an
// aggregationRule (admin, edit, view) to the union of the rules of the
// ClusterRoles its selectors match. It repeats until nothing changes, since
// view aggregates into edit and edit into admin. Whether the shipped roles
// reach admin, edit and view thus still depends on their labels alone.
func aggregate(ctx context.Context) {
	GinkgoHelper()
	for range 5 {
		changed := false
		for _, name := range []string{"view", "edit", "admin"} {
			role := &rbacv1.ClusterRole{}
			Expect(cp.Client.Get(ctx, client.ObjectKey{Name: name}, role)).To(Succeed())
			Expect(role.AggregationRule).NotTo(BeNil(), "the built-in %s role aggregates", name)
			var rules []rbacv1.PolicyRule
			seen := map[string]bool{}
			for _, sel := range role.AggregationRule.ClusterRoleSelectors {
				selector, err := metav1.LabelSelectorAsSelector(&sel)
				Expect(err).NotTo(HaveOccurred())
				list := &rbacv1.ClusterRoleList{}
				Expect(cp.Client.List(ctx, list, client.MatchingLabelsSelector{Selector: selector})).To(Succeed())
				sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
				for _, r := range list.Items {
					if r.Name == name {
						continue
					}
					for _, rule := range r.Rules {
						if key := fmt.Sprint(rule); !seen[key] {
							seen[key] = true
							rules = append(rules, rule)
						}
					}
				}
			}
			if fmt.Sprint(rules) != fmt.Sprint(role.Rules) {
				role.Rules = rules
				Expect(cp.Client.Update(ctx, role)).To(Succeed())
				changed = true
			}
		}
		if !changed {
			return
		}
	}
	Fail("aggregating the built-in roles did not settle")
}

var _ = Describe("RBAC of the default overlay, applied for real", Ordered, func() {
	const (
		team    = "team-a"
		gitops  = "gitops"
		sbxNS   = "sandboxes" // the MCP server's --namespace
		vwcName = "code-sandbox-validating-webhook-configuration"
	)
	var (
		alice = user("alice") // edit in team-a
		bob   = user("bob")   // view in team-a
		carol = user("carol") // admin in team-a
		argo  = serviceAccount(gitops, "argocd")
		mcp   = serviceAccount(installNamespace, "code-sandbox-mcp-server")
		hook  = serviceAccount(installNamespace, "code-sandbox-webhook")
	)

	BeforeAll(func(ctx SpecContext) {
		objs := render("config/default")
		prepare(ctx, objs)
		applied := 0
		for _, o := range objs {
			switch o.GetKind() {
			case "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount":
				Expect(applyForReal(ctx, o)).To(Succeed(), describe(o))
				applied++
			}
		}
		Expect(applied).To(BeNumerically(">=", 15))

		// The shipped roles carry the labels that aggregate them.
		for name, label := range map[string]string{
			"code-sandbox-sandbox-admin-role":  "rbac.authorization.k8s.io/aggregate-to-admin",
			"code-sandbox-sandbox-editor-role": "rbac.authorization.k8s.io/aggregate-to-edit",
			"code-sandbox-sandbox-viewer-role": "rbac.authorization.k8s.io/aggregate-to-view",
		} {
			role := &rbacv1.ClusterRole{}
			Expect(cp.Client.Get(ctx, client.ObjectKey{Name: name}, role)).To(Succeed())
			Expect(role.Labels).To(HaveKeyWithValue(label, "true"), name)
		}
		for _, name := range []string{"code-sandbox-sandbox-exec-role", "code-sandbox-sandboxquota-editor-role", "code-sandbox-mcp-server-role", "code-sandbox-egress-credentials-role"} {
			role := &rbacv1.ClusterRole{}
			Expect(cp.Client.Get(ctx, client.ObjectKey{Name: name}, role)).To(Succeed())
			for k := range role.Labels {
				Expect(k).NotTo(HavePrefix("rbac.authorization.k8s.io/aggregate-to-"), "%s must not aggregate", name)
			}
		}
		aggregate(ctx)

		for _, ns := range []string{team, gitops, sbxNS} {
			ensureNamespace(ctx, ns)
		}
		cp.Bind(team, "edit", testenv.UserSubject(alice.user))
		cp.Bind(team, "view", testenv.UserSubject(bob.user))
		cp.Bind(team, "admin", testenv.UserSubject(carol.user))
		cp.BindCluster("code-sandbox-sandboxquota-editor-role", testenv.ServiceAccountSubject(gitops, "argocd"))
	})

	It("lets edit run Sandboxes and code in them, but not change quotas", func(ctx SpecContext) {
		expectAccess(ctx, alice, []access{
			in(team, "create", "sandboxes"), in(team, "delete", "sandboxes"), in(team, "get", "sandboxes"),
			in(team, "list", "sandboxes"), in(team, "watch", "sandboxes"), in(team, "patch", "sandboxes"),
			in(team, "update", "sandboxes"), in(team, "get", "sandboxes/status"),
			in(team, "create", "sandboxes/exec"), in(team, "create", "sandboxes/files"),
			in(team, "get", "sandboxes/files"), in(team, "get", "sandboxes/log"),
			in(team, "create", "sandboxes/processes"), agg(team, "create", "sandboxes/processes"),
			in(team, "get", "sandboxquotas"), in(team, "list", "sandboxquotas"), in(team, "watch", "sandboxquotas"),
			agg(team, "create", "sandboxes/exec"), agg(team, "create", "sandboxes/files"), agg(team, "get", "sandboxes/files"),
			agg(team, "get", "sandboxes/log"), agg(team, "get", "sandboxes/history"),
			in(team, "create", "sandboxes/portforward"), agg(team, "create", "sandboxes/portforward"),
			agg(team, "get", "sandboxes/metrics"),
		}, []access{
			agg("default", "create", "sandboxes/exec"), agg("default", "create", "sandboxes/portforward"),
			in(team, "create", "sandboxquotas"), in(team, "update", "sandboxquotas"), in(team, "patch", "sandboxquotas"),
			in(team, "delete", "sandboxquotas"), in(team, "update", "sandboxquotas/status"),
			in(team, "update", "sandboxes/status"), in(team, "patch", "sandboxes/status"),
			// Only where bound.
			in("default", "create", "sandboxes"), in("default", "create", "sandboxes/exec"),
		})
	})

	It("lets view read Sandboxes, their logs and quotas, and nothing else", func(ctx SpecContext) {
		expectAccess(ctx, bob, []access{
			in(team, "get", "sandboxes"), in(team, "list", "sandboxes"), in(team, "watch", "sandboxes"),
			in(team, "get", "sandboxes/status"), in(team, "get", "sandboxes/log"),
			in(team, "get", "sandboxquotas"), in(team, "list", "sandboxquotas"),
			agg(team, "get", "sandboxes/log"), agg(team, "get", "sandboxes/history"),
			in(team, "get", "sandboxes/metrics"), agg(team, "get", "sandboxes/metrics"),
		}, []access{
			agg(team, "create", "sandboxes/exec"), agg(team, "create", "sandboxes/files"), agg(team, "get", "sandboxes/files"),
			agg(team, "create", "sandboxes/processes"), in(team, "create", "sandboxes/processes"),
			agg(team, "create", "sandboxes/portforward"), in(team, "create", "sandboxes/portforward"),
			in(team, "create", "sandboxes"), in(team, "delete", "sandboxes"), in(team, "update", "sandboxes"),
			in(team, "create", "sandboxes/exec"), in(team, "create", "sandboxes/files"), in(team, "get", "sandboxes/files"),
			in(team, "update", "sandboxquotas"), in(team, "create", "sandboxquotas"),
			in(team, "update", "sandboxes/status"), in(team, "patch", "sandboxes/status"),
		})
	})

	It("lets admin do everything with Sandboxes but write their status, and still not change quotas", func(ctx SpecContext) {
		expectAccess(ctx, carol, []access{
			in(team, "create", "sandboxes"), in(team, "deletecollection", "sandboxes"),
			in(team, "get", "sandboxes/status"), in(team, "create", "sandboxes/exec"),
			in(team, "get", "sandboxes/log"), in(team, "list", "sandboxquotas"),
			agg(team, "create", "sandboxes/portforward"),
			agg(team, "create", "sandboxes/exec"), agg(team, "create", "sandboxes/files"), agg(team, "get", "sandboxes/files"),
			agg(team, "get", "sandboxes/log"), agg(team, "get", "sandboxes/history"),
		}, []access{
			// Only the node managers write status (config/policy).
			in(team, "update", "sandboxes/status"), in(team, "patch", "sandboxes/status"),
			in(team, "create", "sandboxquotas"), in(team, "update", "sandboxquotas"), in(team, "patch", "sandboxquotas"),
			in(team, "delete", "sandboxquotas"), in(team, "deletecollection", "sandboxquotas"),
			in(team, "patch", "sandboxquotas/status"),
		})
	})

	It("lets the GitOps tool's ServiceAccount with sandboxquota-editor-role manage quotas, and only quotas", func(ctx SpecContext) {
		expectAccess(ctx, argo, []access{
			in(team, "create", "sandboxquotas"), in(team, "update", "sandboxquotas"), in(team, "patch", "sandboxquotas"),
			in(team, "delete", "sandboxquotas"), in(team, "get", "sandboxquotas/status"),
		}, []access{
			in(team, "update", "sandboxquotas/status"), in(team, "create", "sandboxes"), in(team, "get", "sandboxes"),
			in(team, "get", "sandboxes/metrics"), agg(team, "get", "sandboxes/metrics"),
		})
	})

	It("gives the MCP server's ServiceAccount the reviews and the Sandbox rights it needs", func(ctx SpecContext) {
		expectAccess(ctx, mcp, []access{
			core("authentication.k8s.io", "", "create", "tokenreviews", ""),
			core("authorization.k8s.io", "", "create", "subjectaccessreviews", ""),
			in(sbxNS, "create", "sandboxes"), in(sbxNS, "delete", "sandboxes"), in(sbxNS, "get", "sandboxes"),
			in(sbxNS, "list", "sandboxes"), in(sbxNS, "watch", "sandboxes"),
			// patch: spec.paused (--idle-pause, resuming before use); the
			// CRD keeps every other field but the lifetime immutable, and the
			// deadline webhook holds the lifetime to the quota.
			in(sbxNS, "patch", "sandboxes"),
			in(sbxNS, "create", "sandboxes/exec"), in(sbxNS, "create", "sandboxes/files"),
			in(sbxNS, "get", "sandboxes/files"), in(sbxNS, "get", "sandboxes/log"),
			agg(sbxNS, "create", "sandboxes/exec"), agg(sbxNS, "create", "sandboxes/files"), agg(sbxNS, "get", "sandboxes/files"),
			agg(sbxNS, "get", "sandboxes/log"), agg(sbxNS, "get", "sandboxes/history"),
			in(sbxNS, "get", "sandboxes/metrics"), agg(sbxNS, "get", "sandboxes/metrics"),
			// The --max-sandboxes reservation records (one Lease per
			// identity), written with resourceVersion preconditions.
			core("coordination.k8s.io", sbxNS, "get", "leases", ""), core("coordination.k8s.io", sbxNS, "create", "leases", ""),
			core("coordination.k8s.io", sbxNS, "update", "leases", ""),
		}, []access{
			core("coordination.k8s.io", sbxNS, "delete", "leases", ""),
			in(sbxNS, "update", "sandboxes"), in(sbxNS, "update", "sandboxes/status"), in(sbxNS, "patch", "sandboxes/status"),
			in(sbxNS, "update", "sandboxquotas"), in(sbxNS, "list", "sandboxquotas"),
			core("", sbxNS, "get", "secrets", ""),
			core("authentication.k8s.io", "", "create", "tokenrequests", ""),
			core("", "", "impersonate", "users", ""),
		})
	})

	It("lets the webhook patch its own configuration's caBundle, with the name it is given", func(ctx SpecContext) {
		expectAccess(ctx, hook, []access{
			core("admissionregistration.k8s.io", "", "patch", "validatingwebhookconfigurations", vwcName),
			core("admissionregistration.k8s.io", "", "get", "validatingwebhookconfigurations", vwcName),
			core("", installNamespace, "create", "secrets", ""),
			core("coordination.k8s.io", installNamespace, "update", "leases", ""),
			in(team, "list", "sandboxquotas"), in(team, "patch", "sandboxquotas/status"),
			// The warm pool controller creates and deletes pool members and
			// writes pool status; the quota webhook deletes an idle member to
			// make room for a claim.
			in(team, "create", "sandboxes"), in(team, "delete", "sandboxes"),
			in(team, "patch", "sandboxwarmpools/status"),
			// The node-loss controller marks the Sandboxes of a lost node
			// NodeLost (the status policy lets it write that and nothing
			// else) and releases the finalizer of deleted ones.
			in(team, "patch", "sandboxes/status"), in(team, "patch", "sandboxes"),
			core("coordination.k8s.io", "kube-node-lease", "get", "leases", ""),
		}, []access{
			core("admissionregistration.k8s.io", "", "patch", "validatingwebhookconfigurations", "someone-elses"),
			core("", team, "get", "secrets", ""),
			in(team, "update", "sandboxquotas"), in(team, "update", "sandboxwarmpools"),
			in(team, "update", "sandboxes/status"), in(team, "update", "sandboxes"),
			core("coordination.k8s.io", "kube-node-lease", "update", "leases", ""),
		})
	})
})
