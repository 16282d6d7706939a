/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package manifests

import (
	"encoding/json"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	snapshotPolicyName   = "code-sandbox-snapshot-status-writers"
	snapshotPolicyDenied = "ValidatingAdmissionPolicy '" + snapshotPolicyName + "' with binding '" + snapshotPolicyName + "' denied request"
)

func newSnapshot(ns, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": group + "/v1alpha1", "kind": "SandboxSnapshot",
		"spec": map[string]any{"sandboxRef": map[string]any{"name": "src"}},
	}}
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

func patchSnapshotStatus(ctx SpecContext, c client.Client, ns, name string, status map[string]any, opts ...client.SubResourcePatchOption) error {
	data, err := json.Marshal(map[string]any{"status": status})
	Expect(err).NotTo(HaveOccurred())
	u := newSnapshot(ns, name)
	delete(u.Object, "spec")
	return c.Status().Patch(ctx, u, client.RawPatch(types.MergePatchType, data), opts...)
}

var _ = Describe("The SandboxSnapshot status policy of the default overlay, applied for real", Ordered, func() {
	var (
		ns                 string
		managerA, managerB client.Client
		managerUnbound     client.Client
		carol              client.Client
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
		ns = cp.NewNamespace("snap-policy-")
		managerA = tokenClient(cp.NodeBoundToken(installNamespace, managerSA, nodeA))
		managerB = tokenClient(cp.NodeBoundToken(installNamespace, managerSA, nodeB))
		managerUnbound = impersonate(managerUser)
		cp.Bind(ns, "admin", testenv.UserSubject("carol"))
		carol = impersonate("carol")
		Expect(carol.Create(ctx, newSnapshot(ns, "s1"))).To(Succeed(), "a namespace admin creates snapshots")
		Expect(cp.Client.Create(ctx, newSnapshot(ns, "probe"))).To(Succeed())
		probe := func(ctx SpecContext) error {
			return patchSnapshotStatus(ctx, cp.Client, ns, "probe", map[string]any{"node": "x"}, client.DryRunAll)
		}
		// Removed after the specs, and waited for: the API server applies a
		// deleted policy for a moment more, and other Describes write
		// snapshot status as the administrator.
		DeferCleanup(func(ctx SpecContext) {
			Eventually(func(ctx SpecContext) error {
				return patchSnapshotStatus(ctx, cp.Client, ns, "probe", map[string]any{"sizeBytes": 1}, client.DryRunAll)
			}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
		})
		for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
			o := find(objs, kind, snapshotPolicyName)
			Expect(applyForReal(ctx, o)).To(Succeed(), describe(o))
			DeferCleanup(func(ctx SpecContext) {
				Expect(client.IgnoreNotFound(cp.Client.Delete(ctx, o))).To(Succeed())
			})
		}
		Eventually(probe).WithContext(ctx).WithTimeout(30 * time.Second).Should(MatchError(ContainSubstring(snapshotPolicyDenied)))
	})

	expectRefusal := func(err error, message string) {
		GinkgoHelper()
		Expect(err).To(HaveOccurred(), "the policy should have refused this")
		Expect(err).To(MatchError(ContainSubstring(snapshotPolicyDenied)))
		Expect(err).To(MatchError(ContainSubstring(message)))
	}

	It("refuses users, the cluster administrator and a manager token not bound to a Pod", func(ctx SpecContext) {
		expectRefusal(patchSnapshotStatus(ctx, cp.Client, ns, "s1", map[string]any{"node": nodeA}), "only the node managers")
		err := patchSnapshotStatus(ctx, carol, ns, "s1", map[string]any{"node": nodeA})
		Expect(err).To(HaveOccurred(), "RBAC or the policy refuses a user")
		expectRefusal(patchSnapshotStatus(ctx, managerUnbound, ns, "s1", map[string]any{"node": nodeA}), "only with a token bound to its Pod")
	})

	It("lets a manager claim an unclaimed snapshot for its own node only", func(ctx SpecContext) {
		expectRefusal(patchSnapshotStatus(ctx, managerB, ns, "s1", map[string]any{"node": nodeA}),
			"may claim SandboxSnapshot "+ns+"/s1 only for its own node, not for node "+nodeA)
		Expect(patchSnapshotStatus(ctx, managerA, ns, "s1", map[string]any{"node": nodeA, "sizeBytes": 10})).To(Succeed())
	})

	It("refuses the other node's manager any write to node A's snapshot, and node A moving it", func(ctx SpecContext) {
		for _, status := range []map[string]any{{"sizeBytes": 1}, {"node": nodeB}, {"imageID": "sha256:evil"}} {
			expectRefusal(patchSnapshotStatus(ctx, managerB, ns, "s1", status),
				"may not write the status of SandboxSnapshot "+ns+"/s1, which is held by node "+nodeA)
		}
		expectRefusal(patchSnapshotStatus(ctx, managerA, ns, "s1", map[string]any{"node": nodeB}), "may not move SandboxSnapshot "+ns+"/s1 from node "+nodeA+" to node "+nodeB)
		expectRefusal(patchSnapshotStatus(ctx, managerA, ns, "s1", map[string]any{"node": nil}), "to no node")
		Expect(patchSnapshotStatus(ctx, managerA, ns, "s1", map[string]any{"sizeBytes": 20})).To(Succeed())
	})
})
