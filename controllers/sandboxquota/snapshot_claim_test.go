/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxquota_test

import (
	"context"
	"errors"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
)

// The claim check of the snapshot webhook, served for real behind envtest's
// kube-apiserver (config/webhook/manifests.yaml as shipped): the managers'
// requests carry the node name the API server puts in a Pod-bound token,
// exactly as a node manager's do. The status policies are not installed
// here (test/manifests applies them); the admin client stands in for node
// A's manager where it binds the source Sandbox.
var _ = Describe("SandboxSnapshot claims (status.node)", Ordered, func() {
	const (
		nodeA   = "claim-node-a"
		nodeB   = "claim-node-b"
		manager = "claim-manager"
	)
	var (
		ns                 string
		managerA, managerB client.Client
		src                *sandboxv1alpha1.Sandbox
	)
	tokenClient := func(token string) client.Client {
		GinkgoHelper()
		c, err := client.New(cp.ConfigForToken(token), client.Options{Scheme: cp.Scheme})
		Expect(err).NotTo(HaveOccurred())
		return c
	}
	snapshotOf := func(name, source string) *sandboxv1alpha1.SandboxSnapshot {
		GinkgoHelper()
		s := &sandboxv1alpha1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: sandboxv1alpha1.SandboxSnapshotSpec{SandboxRef: sandboxv1alpha1.SnapshotSandboxReference{Name: source}}}
		Expect(cp.Client.Create(context.Background(), s)).To(Succeed())
		return s
	}
	// claim writes what a manager's claim writes (controllers/sandbox
	// snapshot.go): status.node and a Pending Ready condition.
	claim := func(c client.Client, s *sandboxv1alpha1.SandboxSnapshot, node string) error {
		cur := &sandboxv1alpha1.SandboxSnapshot{}
		Expect(cp.Client.Get(context.Background(), client.ObjectKeyFromObject(s), cur)).To(Succeed())
		cur.Status.Node = node
		meta.SetStatusCondition(&cur.Status.Conditions, metav1.Condition{Type: string(sandboxv1alpha1.SnapshotConditionReady),
			Status: metav1.ConditionFalse, Reason: sandboxv1alpha1.SnapshotReasonPending, Message: "waiting"})
		return c.Status().Update(context.Background(), cur)
	}
	nodeOf := func(s *sandboxv1alpha1.SandboxSnapshot) string {
		GinkgoHelper()
		cur := &sandboxv1alpha1.SandboxSnapshot{}
		Expect(cp.Client.Get(context.Background(), client.ObjectKeyFromObject(s), cur)).To(Succeed())
		return cur.Status.Node
	}
	beClaimRefusal := func(substrings ...string) OmegaMatcher {
		return And(beForbidden(substrings...), WithTransform(func(err error) bool {
			var se *apierrors.StatusError
			return errors.As(err, &se) && subresource.HasCause(&se.ErrStatus, subresource.CauseSnapshotClaim)
		}, BeTrue()))
	}

	BeforeAll(func() {
		ctx := context.Background()
		ns = newNamespace()
		cp.CreateClusterRole(manager+"-"+ns, rbacv1.PolicyRule{APIGroups: []string{sandboxv1alpha1.GroupVersion.Group},
			Resources: []string{"sandboxsnapshots", "sandboxsnapshots/status"}, Verbs: []string{"get", "update", "patch"}})
		cp.Bind(ns, manager+"-"+ns, testenv.ServiceAccountSubject(ns, manager))
		managerA = tokenClient(cp.NodeBoundToken(ns, manager, nodeA))
		managerB = tokenClient(cp.NodeBoundToken(ns, manager, nodeB))
		// The source runs on node A: pinned there (no manager of the suite
		// runs node A), and bound as node A's manager binds it.
		src = newSandbox(ns, func(s *sandboxv1alpha1.Sandbox) { s.Spec.NodeName = nodeA })
		Expect(cp.Client.Create(ctx, src)).To(Succeed())
		src.Status.NodeName = nodeA
		Expect(cp.Client.Status().Update(ctx, src)).To(Succeed())
	})

	It("refuses node B's manager a snapshot of a Sandbox on node A, for its own node or for A", func() {
		s := snapshotOf("by-b", src.Name)
		Expect(claim(managerB, s, nodeB)).To(beClaimRefusal(
			"SandboxSnapshot " + ns + "/by-b may not be claimed for node " + nodeB + ": its source Sandbox " + src.Name + " runs on node " + nodeA))
		Expect(claim(managerB, s, nodeA)).To(beClaimRefusal(
			"SandboxSnapshot "+ns+"/by-b may be claimed for node "+nodeA+" (where its source Sandbox "+src.Name+" runs) only by that node's manager",
			"this request comes from node "+nodeB))
		// Nor does a request that names no node (the cluster admin).
		Expect(claim(cp.Client, s, nodeA)).To(beClaimRefusal("this request comes from no node"))
		Expect(nodeOf(s)).To(BeEmpty())
	})

	It("lets node A's manager claim it, then write the rest of its status, but not move it", func() {
		s := snapshotOf("by-a", src.Name)
		Expect(claim(managerA, s, nodeA)).To(Succeed())
		Expect(nodeOf(s)).To(Equal(nodeA))
		// A status update that keeps status.node is not a claim.
		cur := &sandboxv1alpha1.SandboxSnapshot{}
		Expect(cp.Client.Get(context.Background(), client.ObjectKeyFromObject(s), cur)).To(Succeed())
		cur.Status.SizeBytes = 4096
		cur.Status.Storage = "dir:snap-0123456789abcdef0123456789abcdef.tar"
		meta.SetStatusCondition(&cur.Status.Conditions, metav1.Condition{Type: string(sandboxv1alpha1.SnapshotConditionReady),
			Status: metav1.ConditionTrue, Reason: sandboxv1alpha1.SnapshotReasonStored, Message: "stored"})
		Expect(managerA.Status().Update(context.Background(), cur)).To(Succeed())
		// A claimed snapshot's node does not change, whoever asks.
		Expect(claim(managerB, s, nodeB)).To(beClaimRefusal(
			"SandboxSnapshot " + ns + "/by-a is held by node " + nodeA + ": its status.node may not change (to node " + nodeB + ")"))
		Expect(claim(managerA, s, "")).To(beClaimRefusal("its status.node may not change (to no node)"))
		Expect(nodeOf(s)).To(Equal(nodeA))
	})

	It("refuses a claim of a snapshot whose source Sandbox does not exist, or is bound to no node", func() {
		gone := snapshotOf("gone", "never-was")
		Expect(claim(managerA, gone, nodeA)).To(beClaimRefusal(
			"SandboxSnapshot " + ns + "/gone may not be claimed for node " + nodeA + ": its source Sandbox never-was does not exist"))
		unbound := newSandbox(ns, func(s *sandboxv1alpha1.Sandbox) { s.Spec.NodeName = nodeB })
		Expect(cp.Client.Create(context.Background(), unbound)).To(Succeed())
		s := snapshotOf("unbound", unbound.Name)
		Expect(claim(managerB, s, nodeB)).To(beClaimRefusal("its source Sandbox " + unbound.Name + " is bound to no node"))
		Expect(nodeOf(gone)).To(BeEmpty())
		Expect(nodeOf(s)).To(BeEmpty())
	})
})
