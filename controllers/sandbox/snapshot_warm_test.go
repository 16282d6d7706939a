/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/warmpool"
)

// The fork path of restore.go (claimRestoreWarm): a Sandbox with
// spec.snapshotRef whose shape is a warm pool's template takes an idle
// member of that pool and gets the snapshot's files before Ready. The spec
// plays the pool controller (members made by hand, replicas 0), as the
// warm pool claim specs do.
var _ = Describe("Forks from a warm pool (real Docker)", Label("integration", "snapshots"), func() {
	ctx := context.Background()

	It("serves forks from idle members of the pool with the source's shape, restored and fresh, and never from another pool", func() {
		ns := newNamespace()
		node := testNodePrefix + "snap-warm"
		startManager(node, managerConfig{snapshots: nodeStore(filepath.Join(GinkgoT().TempDir(), "s"), nil)})
		shape := func(memory string) sandboxv1alpha1.SandboxTemplate {
			return sandboxv1alpha1.SandboxTemplate{Image: busyboxImage,
				Resources: sandboxv1alpha1.SandboxResources{Memory: ptr.To(resource.MustParse(memory))}}
		}
		newPool := func(name, memory string) *sandboxv1alpha1.SandboxWarmPool {
			GinkgoHelper()
			p := &sandboxv1alpha1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec: sandboxv1alpha1.SandboxWarmPoolSpec{Replicas: ptr.To[int32](0), Template: shape(memory)}}
			Expect(k8sClient.Create(ctx, p)).To(Succeed())
			return p
		}
		idle := func(pool *sandboxv1alpha1.SandboxWarmPool) *sandboxv1alpha1.Sandbox {
			GinkgoHelper()
			m := createSandbox(warmpool.Member(pool))
			key := client.ObjectKeyFromObject(m)
			Eventually(func() bool { return warmpool.Idle(getSandbox(key)) }, 60*time.Second, 100*time.Millisecond).Should(BeTrue())
			return getSandbox(key)
		}
		// An "a-other" pool sorts first: a pool whose template differs
		// (memory) is passed over even when it has an idle member.
		other := newPool("a-other", "64Mi")
		same := newPool("b-same", "96Mi")
		otherMember := idle(other)
		members := map[types.UID]*sandboxv1alpha1.Sandbox{}
		for range 2 {
			m := idle(same)
			members[m.UID] = m
		}

		src := waitReady(createSandbox(newSandbox(ns, "src", node, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Resources = shape("96Mi").Resources
		})))
		out, err := sh(src.Status.ContainerID, "echo hello > /app/a.txt && mkdir -p /app/d && echo deep > /app/d/b && chmod 640 /app/a.txt && ln -s a.txt /app/l && echo t > /tmp/t.txt")
		Expect(err).NotTo(HaveOccurred(), out)
		snap := &sandboxv1alpha1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "s1"},
			Spec: sandboxv1alpha1.SandboxSnapshotSpec{SandboxRef: sandboxv1alpha1.SnapshotSandboxReference{Name: "src"}}}
		Expect(k8sClient.Create(ctx, snap)).To(Succeed())
		Eventually(snapshotReason(client.ObjectKeyFromObject(snap)), 60*time.Second, 100*time.Millisecond).Should(Equal("True/Stored"))

		fork := func(name, memory string) *sandboxv1alpha1.Sandbox {
			return createSandbox(newSandbox(ns, name, "", func(s *sandboxv1alpha1.Sandbox) {
				s.Spec.SnapshotRef = &sandboxv1alpha1.SandboxSnapshotReference{Name: "s1"}
				s.Spec.Resources = shape(memory).Resources
				s.Spec.Env = []sandboxv1alpha1.EnvVar{{Name: "GREETING", Value: "hi"}}
			}))
		}
		// Three forks of the source's shape: two take the two idle members
		// of b-same, the third is created cold (no idle member is left).
		var kids []*sandboxv1alpha1.Sandbox
		for _, name := range []string{"fork-1", "fork-2", "fork-3"} {
			kids = append(kids, fork(name, "96Mi"))
		}
		var warm, cold []*sandboxv1alpha1.Sandbox
		for i := range kids {
			kids[i] = waitReady(kids[i])
			k := kids[i]
			Expect(k.Status.NodeName).To(Equal(node))
			Expect(meta.IsStatusConditionTrue(k.Status.Conditions, string(sandboxv1alpha1.SandboxConditionSnapshotRestored))).To(BeTrue())
			out, err := sh(k.Status.ContainerID, "cat /app/a.txt /app/d/b /tmp/t.txt && stat -c %a /app/a.txt && readlink /app/l && ls /app")
			Expect(err).NotTo(HaveOccurred(), out)
			Expect(out).To(Equal("hello\ndeep\nt\n640\na.txt\na.txt\nd\nl"), "fork %s has the files", k.Name)
			if claimReason(k) == "True/WarmPoolClaimed" {
				warm = append(warm, k)
			} else {
				cold = append(cold, k)
			}
		}
		Expect(warm).To(HaveLen(2), "two forks came from the pool")
		Expect(cold).To(HaveLen(1))
		Expect(cold[0].Status.WarmPool).To(BeNil())
		seen := map[types.UID]bool{}
		for _, k := range warm {
			m := members[k.Status.WarmPool.Member.UID]
			Expect(m).NotTo(BeNil(), "fork %s took a member of b-same", k.Name)
			Expect(seen[m.UID]).To(BeFalse(), "each member goes to one fork")
			seen[m.UID] = true
			Expect(k.Status.ContainerID).To(Equal(m.Status.ContainerID))
			Expect(k.ContainerUID()).To(Equal(m.UID))
			Expect(k.Status.WarmPool.TemplateHash).To(Equal(warmpool.Hash(same.Spec.Template)))
			// The member records the handover, as for any claim.
			Eventually(readyReason(client.ObjectKeyFromObject(m)), 10*time.Second).Should(Equal("False/Claimed"))
		}
		// The other pool's member was not used: still idle and frozen.
		Expect(warmpool.Idle(getSandbox(client.ObjectKeyFromObject(otherMember)))).To(BeTrue())
		Expect(inspect(otherMember.Status.ContainerID).State.Paused).To(BeTrue())

		// Fresh: every child has its own hostname and machine-id, none the
		// source's.
		ids := map[string]bool{}
		hosts := map[string]bool{}
		for _, k := range append([]*sandboxv1alpha1.Sandbox{src}, kids...) {
			out, err := sh(k.Status.ContainerID, "cat /etc/machine-id; hostname")
			Expect(err).NotTo(HaveOccurred(), out)
			var id, host string
			_, _ = fmt.Sscan(out, &id, &host)
			Expect(id).To(MatchRegexp(`^[0-9a-f]{32}$`))
			ids[id], hosts[host] = true, true
		}
		Expect(ids).To(HaveLen(4), "own machine-ids")
		Expect(hosts).To(HaveLen(4), "own hostnames")

		// A warm child's own writes stay out of its siblings and the source.
		_, err = sh(warm[0].Status.ContainerID, "echo mine > /app/own.txt && echo changed > /app/a.txt")
		Expect(err).NotTo(HaveOccurred())
		for _, k := range []*sandboxv1alpha1.Sandbox{warm[1], cold[0], src} {
			out, err := sh(k.Status.ContainerID, "cat /app/a.txt; ls /app/own.txt 2>&1 || true")
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(HavePrefix("hello\n"), "%s keeps its own a.txt", k.Name)
			Expect(out).To(ContainSubstring("No such file"), "%s has no own.txt", k.Name)
		}

		// A fork of another shape (64Mi) takes the a-other member: the
		// match is the template's, not the pool's name.
		k := waitReady(fork("fork-other", "64Mi"))
		Expect(claimReason(k)).To(Equal("True/WarmPoolClaimed"))
		Expect(k.Status.WarmPool.Member.UID).To(Equal(otherMember.UID))
		out, err = sh(k.Status.ContainerID, "cat /app/a.txt")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(Equal("hello"))
	})
})
