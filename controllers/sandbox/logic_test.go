/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"strings"
	"time"
	"unicode/utf8"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/event"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
)

var _ = Describe("truncateMessage", Label("unit"), func() {
	It("keeps a short message whole", func() {
		Expect(truncateMessage("héllo")).To(Equal("héllo"))
		exact := strings.Repeat("é", 2048)
		Expect(truncateMessage(exact)).To(Equal(exact), "4096 bytes is within the limit")
	})

	DescribeTable("cuts a long message at a rune boundary, never inside a character",
		func(prefix, char string) {
			long := prefix + strings.Repeat(char, 5000)
			got := truncateMessage(long)
			Expect(utf8.ValidString(got)).To(BeTrue(), "cut inside a character: %q", got[len(got)-8:])
			Expect(got).To(HaveSuffix("…"))
			body := strings.TrimSuffix(got, "…")
			Expect(len(body)).To(BeNumerically("<=", 4096))
			Expect(len(body)).To(BeNumerically(">", 4096-utf8.UTFMax), "cuts no more than one character short")
			Expect(long).To(HavePrefix(body))
		},
		Entry("ASCII", "", "a"),
		Entry("two-byte characters, cut falls inside one", "a", "é"),
		Entry("three-byte characters", "", "€"),
		Entry("four-byte characters, cut falls inside one", "ab", "😀"),
	)
})

var _ = Describe("backoffTracker", Label("unit"), func() {
	It("doubles per failure up to the cap, counts down with the clock, and resets", func() {
		clk := clocktesting.NewFakePassiveClock(time.Unix(1_000_000, 0))
		b := newBackoffTracker(clk, time.Second, 10*time.Second)
		uid := types.UID("u1")

		Expect(b.remaining(uid)).To(BeZero(), "no failure yet, no wait")
		Expect(b.next(uid)).To(Equal(time.Second))
		Expect(b.next(uid)).To(Equal(2 * time.Second))
		Expect(b.next(uid)).To(Equal(4 * time.Second))
		Expect(b.next(uid)).To(Equal(8 * time.Second))
		Expect(b.next(uid)).To(Equal(10*time.Second), "capped")
		for range 100 {
			Expect(b.next(uid)).To(Equal(10*time.Second), "no overflow after many failures")
		}
		Expect(b.remaining(uid)).To(Equal(10 * time.Second))
		clk.SetTime(clk.Now().Add(4 * time.Second))
		Expect(b.remaining(uid)).To(Equal(6 * time.Second))
		clk.SetTime(clk.Now().Add(time.Minute))
		Expect(b.remaining(uid)).To(BeZero())

		Expect(b.next(types.UID("u2"))).To(Equal(time.Second), "per Sandbox")
		b.reset(uid)
		Expect(b.next(uid)).To(Equal(time.Second))
	})
})

var _ = Describe("expiryTime", Label("unit"), func() {
	It("counts activeDeadlineSeconds from status.startTime", func() {
		sbx := &sandboxv1alpha1.Sandbox{}
		_, ok := expiryTime(sbx)
		Expect(ok).To(BeFalse(), "no lifetime")

		sbx.Spec.ActiveDeadlineSeconds = ptr.To[int64](90)
		_, ok = expiryTime(sbx)
		Expect(ok).To(BeFalse(), "not started yet")

		start := metav1.NewTime(time.Unix(2_000_000, 0))
		sbx.Status.StartTime = &start
		at, ok := expiryTime(sbx)
		Expect(ok).To(BeTrue())
		Expect(at).To(Equal(start.Add(90 * time.Second)))
	})
})

var _ = Describe("dockerSpecFor", Label("unit"), func() {
	It("translates the Sandbox spec into the runtime's spec", func() {
		sbx := &sandboxv1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n", UID: "uid-1"},
			Spec: sandboxv1alpha1.SandboxSpec{
				Image:           "img:1",
				ImagePullPolicy: sandboxv1alpha1.PullNever,
				Command:         []string{"python3", "-c", "1"},
				Env:             []sandboxv1alpha1.EnvVar{{Name: "A", Value: "b=c"}},
				WorkingDir:      "/work",
				User:            "1000:1000",
				Resources: sandboxv1alpha1.SandboxResources{
					CPU:    ptr.To(resource.MustParse("250m")),
					Memory: ptr.To(resource.MustParse("64Mi")),
					Pids:   ptr.To[int64](32),
					Disk:   ptr.To(resource.MustParse("10Mi")),
				},
				Network: sandboxv1alpha1.SandboxNetwork{Mode: sandboxv1alpha1.NetworkEgress},
				Runtime: sandboxv1alpha1.RuntimeGVisor,
			},
		}
		spec, err := dockerSpecFor(sbx, Options{NodeName: "node-1", StopGracePeriod: 3 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		Expect(spec.Owner).To(Equal(dockerruntime.Owner{UID: "uid-1", Namespace: "ns", Name: "n", Node: "node-1"}))
		Expect(spec.Image).To(Equal("img:1"))
		Expect(spec.PullPolicy).To(Equal(dockerruntime.PullNever))
		Expect(spec.Command).To(Equal([]string{"python3", "-c", "1"}))
		Expect(spec.Env).To(Equal([]string{"A=b=c"}))
		Expect(spec.WorkingDir).To(Equal("/work"))
		Expect(spec.User).To(Equal("1000:1000"))
		Expect(spec.NanoCPUs).To(BeEquivalentTo(250_000_000))
		Expect(spec.MemoryBytes).To(BeEquivalentTo(64 << 20))
		Expect(spec.Pids).To(BeEquivalentTo(32))
		Expect(spec.DiskBytes).To(BeEquivalentTo(10 << 20))
		Expect(spec.Network).To(Equal(dockerruntime.NetworkEgress))
		Expect(spec.Runtime).To(Equal(dockerruntime.RuntimeRunsc))
		Expect(spec.StopGracePeriod).To(Equal(3 * time.Second))

		// With a policy, the policy network: redirected to the proxy
		// from the first packet, before the policy is set.
		sbx.Spec.Network.Egress = &sandboxv1alpha1.EgressPolicy{Allow: []sandboxv1alpha1.EgressRule{{Host: "example.com"}}}
		spec, err = dockerSpecFor(sbx, Options{NodeName: "node-1"})
		Expect(err).NotTo(HaveOccurred())
		Expect(spec.Network).To(Equal(dockerruntime.NetworkEgressPolicy))
	})

	It("leaves unset limits to the runtime's defaults and rejects unknown enums", func() {
		sbx := &sandboxv1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{UID: "u"}, Spec: sandboxv1alpha1.SandboxSpec{Image: "i"}}
		spec, err := dockerSpecFor(sbx, Options{NodeName: "n"})
		Expect(err).NotTo(HaveOccurred())
		Expect(spec.NanoCPUs).To(BeZero())
		Expect(spec.MemoryBytes).To(BeZero())
		Expect(spec.Network).To(Equal(dockerruntime.NetworkNone))
		Expect(spec.Runtime).To(Equal(dockerruntime.RuntimeRunc))

		sbx.Spec.Runtime = "kata"
		_, err = dockerSpecFor(sbx, Options{NodeName: "n"})
		Expect(err).To(MatchError(ContainSubstring(`unknown runtime "kata"`)))
		sbx.Spec.Runtime = ""
		sbx.Spec.Network.Mode = "Host"
		_, err = dockerSpecFor(sbx, Options{NodeName: "n"})
		Expect(err).To(MatchError(ContainSubstring(`unknown network mode "Host"`)))
	})
})

var _ = Describe("deletion bookkeeping", Label("unit"), func() {
	It("lets the delete event of a Sandbox bound to this node, or unbound, through the predicate", func() {
		p := (&SandboxReconciler{opts: Options{NodeName: "a"}}).relevant()
		deleted := func(specNode, statusNode string) bool {
			sbx := &sandboxv1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", UID: "u"}}
			sbx.Spec.NodeName, sbx.Status.NodeName = specNode, statusNode
			return p.Delete(event.DeleteEvent{Object: sbx})
		}
		Expect(deleted("", "a")).To(BeTrue(), "bound here")
		Expect(deleted("a", "a")).To(BeTrue(), "pinned and bound here")
		Expect(deleted("", "")).To(BeTrue(), "deleted before anyone claimed it")
		Expect(deleted("", "b")).To(BeFalse(), "bound to another node")
		Expect(deleted("b", "")).To(BeFalse(), "pinned to another node")
	})

	It("records deleted UIDs per name until taken, and puts them back for a retry", func() {
		t := newDeletedTracker()
		key := types.NamespacedName{Namespace: "ns", Name: "s"}
		Expect(t.take(key)).To(BeEmpty())
		t.add(key, "u1")
		t.add(key, "u2", "u1")
		got := t.take(key)
		Expect(got).To(ConsistOf(types.UID("u1"), types.UID("u2")))
		Expect(t.take(key)).To(BeEmpty())
		t.add(key, got...)
		t.add(key)
		Expect(t.take(key)).To(HaveLen(2))
	})

	It("releases a claim only for the UID that holds it", func() {
		c := newClaimTracker()
		key := types.NamespacedName{Namespace: "ns", Name: "s"}
		c.claimed[key] = "new"
		c.releaseUID(key, "old")
		Expect(c.claimed).To(HaveKeyWithValue(key, types.UID("new")), "a successor under the same name keeps its claim")
		c.releaseUID(key, "new")
		Expect(c.claimed).NotTo(HaveKey(key))
	})
})

var _ = Describe("spreading warm pool members", Label("unit"), func() {
	It("counts the excess over the live node holding the fewest, unknown nodes and dead ones aside", func() {
		held := map[string]int{"a": 3, "b": 1, "dead": 0}
		Expect(spreadExcess(held, []string{"a", "b"}, "a")).To(Equal(2))
		Expect(spreadExcess(held, []string{"a", "b"}, "b")).To(Equal(0))
		// A live node holding none (it may run no Sandbox at all).
		Expect(spreadExcess(held, []string{"a", "b", "c"}, "a")).To(Equal(3))
		// A node without a live Lease does not hold anyone back.
		Expect(spreadExcess(held, []string{"a"}, "a")).To(Equal(0))
		// This manager is always a candidate, listed or not.
		Expect(spreadExcess(held, nil, "b")).To(Equal(0))
	})

	It("counts the hold-back once, from the first time a member was seen", func() {
		t := newSpreadTracker()
		now := time.Unix(1000, 0)
		Expect(t.remaining("m1", now, 500*time.Millisecond)).To(Equal(500 * time.Millisecond))
		Expect(t.remaining("m1", now.Add(400*time.Millisecond), 500*time.Millisecond)).To(Equal(100 * time.Millisecond))
		Expect(t.remaining("m1", now.Add(600*time.Millisecond), 500*time.Millisecond)).To(BeNumerically("<=", 0))
		t.forget("m1")
		Expect(t.remaining("m1", now.Add(time.Second), 250*time.Millisecond)).To(Equal(250 * time.Millisecond))
	})
})

var _ = Describe("a warm pool member named in the status", Label("unit"), func() {
	member := func(ref bool) *sandboxv1alpha1.Sandbox {
		sbx := &sandboxv1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "claimant", UID: "claimant-uid"}}
		if ref {
			sbx.Spec.WarmPoolRef = &sandboxv1alpha1.WarmPoolReference{Name: "pool"}
		}
		sbx.Status.WarmPool = &sandboxv1alpha1.SandboxWarmPoolClaimStatus{
			Member: &sandboxv1alpha1.WarmPoolMemberReference{Name: "pool-abcde", UID: "member-uid"}}
		return sbx
	}
	container := func(ns, name, node string) dockerruntime.Container {
		return dockerruntime.Container{ID: "0123456789abcdef", Labels: map[string]string{
			dockerruntime.LabelNamespace: ns, dockerruntime.LabelName: name, dockerruntime.LabelNode: node}}
	}
	r := &SandboxReconciler{opts: Options{NodeName: "a"}}

	It("counts only with spec.warmPoolRef", func() {
		Expect(member(false).ContainerUID()).To(Equal(types.UID("claimant-uid")))
		Expect(member(true).ContainerUID()).To(Equal(types.UID("member-uid")))
	})
	It("is adopted only if its container was made for that member, in the same namespace, on this node", func() {
		Expect(r.verifyMemberContainer(member(true), container("ns", "pool-abcde", "a"))).To(Succeed())
		Expect(r.verifyMemberContainer(member(true), container("victim-ns", "pool-abcde", "a"))).To(MatchError(ContainSubstring("refusing to adopt it")))
		Expect(r.verifyMemberContainer(member(true), container("ns", "victim", "a"))).To(MatchError(ContainSubstring("belongs to Sandbox ns/victim")))
		Expect(r.verifyMemberContainer(member(true), container("ns", "pool-abcde", "b"))).To(MatchError(ContainSubstring(`on node "b"`)))
		Expect(r.ownContainers(member(true), []dockerruntime.Container{container("victim-ns", "v", "a"), container("ns", "pool-abcde", "a")})).To(HaveLen(1))
		// Without spec.warmPoolRef the Sandbox's own container is the only one.
		Expect(r.verifyMemberContainer(member(false), container("ns", "claimant", "a"))).To(Succeed())
	})
})
