/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandboxquota_test

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/snapshotstore"
	"github.com/code-sandbox/code-sandbox-operator/internal/subresource"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv"
	"github.com/code-sandbox/code-sandbox-operator/internal/testenv/testnode"
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

// A node manager as deployed: its own ServiceAccount with the shipped
// manager role, and a token bound to a Pod on its node. Its claim passes
// the webhook, and it takes the snapshot.
var _ = Describe("A node manager with a node-bound token", Ordered, func() {
	const (
		nodeC   = "claim-node-real"
		account = "claim-node-manager"
	)
	It("claims and takes a snapshot of its own Sandbox through the webhook", func() {
		ctx := context.Background()
		ns := newNamespace() // the spec deletes its Sandbox itself, while the node runs
		cp.BindCluster(cp.CreateShippedClusterRole("role.yaml"), testenv.ServiceAccountSubject(ns, account))
		dir, err := snapshotstore.NewDir(filepath.Join(GinkgoT().TempDir(), "snaps"), 0)
		Expect(err).NotTo(HaveOccurred())
		n := testnode.Start(cp, nil, testnode.NodeOptions{Name: nodeC, Endpoint: "https://127.0.0.1:1",
			Snapshots: &snapshotstore.Node{Dir: dir}, Config: cp.ConfigForToken(cp.NodeBoundToken(ns, account, nodeC))})
		DeferCleanup(func() { n.Stop(); testenv.RemoveNodeContainers(docker, nodeC) })

		sbx := newSandbox(ns, func(s *sandboxv1alpha1.Sandbox) { s.Spec.NodeName = nodeC })
		Expect(cp.Client.Create(ctx, sbx)).To(Succeed())
		snap := &sandboxv1alpha1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "real"},
			Spec: sandboxv1alpha1.SandboxSnapshotSpec{SandboxRef: sandboxv1alpha1.SnapshotSandboxReference{Name: sbx.Name}}}
		Expect(cp.Client.Create(ctx, snap)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(cp.Client.Get(ctx, client.ObjectKeyFromObject(snap), snap)).To(Succeed())
			g.Expect(snap.Status.Node).To(Equal(nodeC))
			g.Expect(snap.IsReady()).To(BeTrue(), "%+v", snap.Status.Conditions)
		}, 120*time.Second, 250*time.Millisecond).Should(Succeed())
		// Its data goes with it: the finalizer is the manager's.
		Expect(cp.Client.Delete(ctx, snap)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(cp.Client.Get(ctx, client.ObjectKeyFromObject(snap), snap))
		}, 60*time.Second, 250*time.Millisecond).Should(BeTrue())
		Expect(cp.Client.Delete(ctx, sbx)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(cp.Client.Get(ctx, client.ObjectKeyFromObject(sbx), sbx))
		}, 60*time.Second, 250*time.Millisecond).Should(BeTrue())
	})
})
