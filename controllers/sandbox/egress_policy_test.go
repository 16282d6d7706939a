/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/dockerruntime"
	"github.com/code-sandbox/code-sandbox-operator/internal/egressproxy"
)

// recordingProxy is a real egress proxy (egressproxy.Node without a
// firewall: this test does not own the node's iptables) whose policies the
// test can also read back in full (the proxy itself only tells ports per
// address).
type recordingProxy struct {
	*egressproxy.Node
	mu   sync.Mutex
	last map[netip.Addr]egressproxy.Policy
}

func newRecordingProxy() *recordingProxy {
	GinkgoHelper()
	ca, err := egressproxy.LoadOrCreateCA(GinkgoT().TempDir(), time.Now())
	Expect(err).NotTo(HaveOccurred())
	p, err := egressproxy.New(egressproxy.Config{Listen: "127.0.0.1:0", DNSListen: "127.0.0.1:0", Upstream: "127.0.0.1:53", CA: ca})
	Expect(err).NotTo(HaveOccurred())
	return &recordingProxy{Node: egressproxy.NewNode(p, nil), last: map[netip.Addr]egressproxy.Policy{}}
}

func (p *recordingProxy) Policies() map[netip.Addr][]uint16 { return p.Proxy().Policies() }

func (p *recordingProxy) SetPolicy(src netip.Addr, pol egressproxy.Policy) error {
	if err := p.Node.SetPolicy(src, pol); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last[src] = pol
	return nil
}

func (p *recordingProxy) RemovePolicy(src netip.Addr) {
	p.Node.RemovePolicy(src)
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.last, src)
}

func (p *recordingProxy) policy(src netip.Addr) (egressproxy.Policy, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pol, ok := p.last[src]
	return pol, ok
}

// hosts lists a policy's hosts with their ports as the real proxy has them.
func (p *recordingProxy) ports(src netip.Addr) []uint16 { return p.Policies()[src] }

// egressAddrOf is the container's address on network (NetworkEgress or
// NetworkEgressPolicy); it must be on that one only.
func egressAddrOf(uid types.UID, network string) netip.Addr {
	GinkgoHelper()
	list := containersOf(uid)
	Expect(list).To(HaveLen(1))
	ins, err := docker.ContainerInspect(context.Background(), list[0].ID)
	Expect(err).NotTo(HaveOccurred())
	Expect(ins.NetworkSettings.Networks).To(HaveLen(1))
	ep := ins.NetworkSettings.Networks[network]
	Expect(ep).NotTo(BeNil(), "the container is not on "+network)
	a, err := netip.ParseAddr(ep.IPAddress)
	Expect(err).NotTo(HaveOccurred())
	return a
}

func egressCondition(key types.NamespacedName) func() string {
	return func() string {
		c := meta.FindStatusCondition(getSandbox(key).Status.Conditions, string(sandboxv1alpha1.SandboxConditionEgressPolicyApplied))
		if c == nil {
			return ""
		}
		return string(c.Status) + "/" + c.Reason
	}
}

var nodeSeq int

var _ = Describe("Egress policies on a node", func() {
	ctx := context.Background()
	var (
		ns    string
		proxy *recordingProxy
		node  string
		mgr   *testManager
	)
	BeforeEach(func() {
		ns = newNamespace()
		proxy = newRecordingProxy()
		nodeSeq++
		node = fmt.Sprintf("%segress-policy-%d", testNodePrefix, nodeSeq)
		mgr = startManager(node, managerConfig{egressProxy: proxy})
	})

	policySandbox := func(name string, rules ...sandboxv1alpha1.EgressRule) *sandboxv1alpha1.Sandbox {
		return createSandbox(newSandbox(ns, name, node, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Network = sandboxv1alpha1.SandboxNetwork{Mode: sandboxv1alpha1.NetworkEgress,
				Egress: &sandboxv1alpha1.EgressPolicy{Allow: rules}}
		}))
	}

	It("hands the policy to the proxy, applies a change within a second, and removes it with the container", func() {
		sbx := policySandbox("live", sandboxv1alpha1.EgressRule{Host: "a.example.com", Ports: []int32{443}})
		key := client.ObjectKeyFromObject(sbx)
		Eventually(readyReason(key), 60*time.Second, 100*time.Millisecond).Should(Equal("True/Running"))
		Eventually(egressCondition(key), 10*time.Second, 50*time.Millisecond).Should(Equal("True/EgressPolicyApplied"))
		// A sandbox with a policy is on the policy network (redirected to
		// the proxy from its first packet), never on the plain one.
		addr := egressAddrOf(getSandbox(key).UID, dockerruntime.NetworkEgressPolicy)
		pol, ok := proxy.policy(addr)
		Expect(ok).To(BeTrue())
		Expect(pol.Sandbox).To(Equal(ns + "/live"))
		Expect(pol.Rules).To(Equal([]egressproxy.Rule{{Host: "a.example.com", Ports: []uint16{443}}}))
		Expect(proxy.ports(addr)).To(Equal([]uint16{443}))

		// A live change: the real proxy holds it within a second.
		s := getSandbox(key)
		s.Spec.Network.Egress.Allow = []sandboxv1alpha1.EgressRule{{Host: "*.b.example.com", Ports: []int32{8443}}}
		Expect(k8sClient.Update(ctx, s)).To(Succeed())
		changed := time.Now()
		Eventually(func() []uint16 { return proxy.ports(addr) }, time.Second, 10*time.Millisecond).Should(Equal([]uint16{8443}))
		GinkgoWriter.Printf("policy change reached the proxy in %v\n", time.Since(changed))
		pol, _ = proxy.policy(addr)
		Expect(pol.Rules).To(Equal([]egressproxy.Rule{{Host: "*.b.example.com", Ports: []uint16{8443}}}))

		// An empty list: still a policy, reaching nothing.
		s = getSandbox(key)
		s.Spec.Network.Egress.Allow = nil
		Expect(k8sClient.Update(ctx, s)).To(Succeed())
		Eventually(func() bool { p, ok := proxy.policy(addr); return ok && len(p.Rules) == 0 }, time.Second, 10*time.Millisecond).Should(BeTrue())

		Expect(k8sClient.Delete(ctx, getSandbox(key))).To(Succeed())
		Eventually(isGone(key), 30*time.Second, 100*time.Millisecond).Should(BeTrue())
		Expect(proxy.Policies()).NotTo(HaveKey(addr), "a policy outlived its container: the next container at this address would inherit it")
	})

	It("injects a labelled Secret of the Sandbox's namespace, and never shows its value", func() {
		const secretValue = "s3cr3t-token-value-0123456789"
		sbx := policySandbox("inject", sandboxv1alpha1.EgressRule{Host: "api.example.com",
			HTTP:   &sandboxv1alpha1.EgressHTTPRule{Methods: []sandboxv1alpha1.EgressHTTPMethod{"GET"}, PathPrefixes: []string{"/v1/"}},
			Inject: &sandboxv1alpha1.EgressInjection{Header: "Authorization", ValuePrefix: "Bearer ", SecretRef: sandboxv1alpha1.EgressSecretKeyRef{Name: "api", Key: "token"}}},
			sandboxv1alpha1.EgressRule{Host: "pypi.org"})
		key := client.ObjectKeyFromObject(sbx)
		Eventually(readyReason(key), 60*time.Second, 100*time.Millisecond).Should(Equal("True/Running"))
		// No Secret yet: that host is left out (refused), the rest applies.
		Eventually(egressCondition(key), 10*time.Second, 50*time.Millisecond).Should(Equal("False/SecretNotFound"))
		// A sandbox with a policy is on the policy network (redirected to
		// the proxy from its first packet), never on the plain one.
		addr := egressAddrOf(getSandbox(key).UID, dockerruntime.NetworkEgressPolicy)
		pol, _ := proxy.policy(addr)
		Expect(pol.Rules).To(Equal([]egressproxy.Rule{{Host: "pypi.org"}}))

		// Unlabelled: still not used.
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "api"}, Data: map[string][]byte{"token": []byte(secretValue)}}
		Expect(k8sClient.Create(ctx, sec)).To(Succeed())
		Eventually(egressCondition(key), 10*time.Second, 50*time.Millisecond).Should(Equal("False/SecretForbidden"))

		// A Secret of the same name in another namespace is never read.
		other := newNamespace()
		Expect(k8sClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "api",
			Labels: map[string]string{sandboxv1alpha1.LabelEgressCredential: "true"}}, Data: map[string][]byte{"token": []byte("other-namespace")}})).To(Succeed())

		sec.Labels = map[string]string{sandboxv1alpha1.LabelEgressCredential: "true"}
		Expect(k8sClient.Update(ctx, sec)).To(Succeed())
		Eventually(egressCondition(key), 10*time.Second, 50*time.Millisecond).Should(Equal("True/EgressPolicyApplied"))
		pol, _ = proxy.policy(addr)
		Expect(pol.Rules).To(ConsistOf(
			egressproxy.Rule{Host: "pypi.org"},
			egressproxy.Rule{Host: "api.example.com", Inject: &egressproxy.Injection{Header: "Authorization",
				Value: []byte("Bearer " + secretValue), Methods: []string{"GET"}, PathPrefixes: []string{"/v1/"}}},
		))

		// The value is nowhere the sandbox's users or the sandbox can see.
		raw, err := json.Marshal(getSandbox(key))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(raw)).NotTo(ContainSubstring(secretValue))
		var evs eventsv1.EventList
		Expect(k8sClient.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
		rawEvents, err := json.Marshal(evs)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(rawEvents)).NotTo(ContainSubstring(secretValue))
		ins, err := docker.ContainerInspect(ctx, containersOf(getSandbox(key).UID)[0].ID)
		Expect(err).NotTo(HaveOccurred())
		rawInspect, err := json.Marshal(ins)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(rawInspect)).NotTo(ContainSubstring(secretValue), "the value reached the container's config (env, labels, mounts)")

		// The proxy's CA is in the sandbox, through the helper, and the
		// usual TLS clients are pointed at it.
		id := containersOf(getSandbox(key).UID)[0].ID
		Expect(dockerExecOutput(id, "cat", dockerruntime.EgressCAFile)).To(Equal(string(proxy.CAPEM())))
		Expect(dockerExecOutput(id, "cat", dockerruntime.EgressCABundle)).To(HaveSuffix(string(proxy.CAPEM())))
		Expect(ins.Config.Env).To(ContainElements(dockerruntime.EgressCAEnv()))
	})

	It("records the proxy's refusals as Warning Events on the Sandbox, rate-limited, quoted", func() {
		sbx := policySandbox("refused", sandboxv1alpha1.EgressRule{Host: "a.example.com"})
		key := client.ObjectKeyFromObject(sbx)
		Eventually(func() error { return mgr.reconciler.client.Get(ctx, key, &sandboxv1alpha1.Sandbox{}) }, 10*time.Second, 50*time.Millisecond).Should(Succeed())
		refusals := func() []eventsv1.Event {
			var evs eventsv1.EventList
			Expect(k8sClient.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
			var out []eventsv1.Event
			for _, ev := range evs.Items {
				if ev.Reason == EventReasonEgressRefused && ev.Regarding.Name == "refused" {
					out = append(out, ev)
				}
			}
			return out
		}
		refuse := func(host, reason, path string) egressproxy.Event {
			return egressproxy.Event{Time: time.Now(), Sandbox: ns + "/refused", Host: host, Port: 443, Method: "GET", Path: path,
				Decision: egressproxy.DecisionRefused, Reason: reason}
		}
		// A sandbox retrying in a loop: one Event.
		for range 20 {
			mgr.reconciler.EgressAudit(refuse("evil.example.org", egressproxy.ReasonNotAllowed, "/x\x1b[31m\n"))
		}
		// Not refusals, or not a sandbox: none.
		mgr.reconciler.EgressAudit(egressproxy.Event{Sandbox: ns + "/refused", Host: "a.example.com", Port: 443, Decision: egressproxy.DecisionInjected, Reason: egressproxy.ReasonInjected})
		mgr.reconciler.EgressAudit(egressproxy.Event{Sandbox: "", Host: "x.example.org", Port: 443, Decision: egressproxy.DecisionRefused, Reason: egressproxy.ReasonNoPolicy})
		mgr.reconciler.EgressAudit(refuse("other.example.org", egressproxy.ReasonNotAllowed, "/"))
		mgr.reconciler.EgressAudit(refuse("1.2.3.4", egressproxy.ReasonRawIP, "/"))
		// One Event per kind of refusal (the events API folds the other
		// host's NotAllowed into the first one's series).
		Eventually(func() int { return len(refusals()) }, 10*time.Second, 100*time.Millisecond).Should(Equal(2))
		Consistently(func() int { return len(refusals()) }, 2*time.Second, 200*time.Millisecond).Should(Equal(2))
		var notes []string
		for _, ev := range refusals() {
			Expect(ev.Type).To(Equal("Warning"))
			Expect(ev.Note).NotTo(ContainSubstring("\x1b"), "the sandbox's bytes are quoted")
			Expect(ev.Note).NotTo(ContainSubstring("\n"))
			notes = append(notes, ev.Note)
		}
		Expect(strings.Join(notes, "|")).To(And(
			ContainSubstring(`"evil.example.org":443 "GET" "/x\x1b[31m\n": NotAllowed`),
			ContainSubstring(`"1.2.3.4":443 "GET" "/": RawIP`)))
	})

	It("keeps unrestricted Egress without a policy", func() {
		sbx := createSandbox(newSandbox(ns, "open", node, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Network.Mode = sandboxv1alpha1.NetworkEgress
		}))
		key := client.ObjectKeyFromObject(sbx)
		Eventually(readyReason(key), 60*time.Second, 100*time.Millisecond).Should(Equal("True/Running"), func() string { return readyMessage(key) })
		Consistently(egressCondition(key), time.Second, 100*time.Millisecond).Should(BeEmpty())
		Expect(proxy.Policies()).NotTo(HaveKey(egressAddrOf(getSandbox(key).UID, dockerruntime.NetworkEgress)))
	})
})

var _ = Describe("Egress policies on a node without a proxy", func() {
	It("creates no container rather than one with unrestricted egress", func() {
		ns := newNamespace()
		node := testNodePrefix + "egress-noproxy"
		startManager(node, managerConfig{})
		sbx := createSandbox(newSandbox(ns, "closed", node, func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Network = sandboxv1alpha1.SandboxNetwork{Mode: sandboxv1alpha1.NetworkEgress,
				Egress: &sandboxv1alpha1.EgressPolicy{Allow: []sandboxv1alpha1.EgressRule{{Host: "a.example.com"}}}}
		}))
		key := client.ObjectKeyFromObject(sbx)
		Eventually(readyReason(key), 30*time.Second, 100*time.Millisecond).Should(Equal("False/EgressProxyUnavailable"))
		Consistently(containerCount(sbx.UID), time.Second, 100*time.Millisecond).Should(BeZero())
	})
})

func readyMessage(key types.NamespacedName) string {
	c := meta.FindStatusCondition(getSandbox(key).Status.Conditions, string(sandboxv1alpha1.SandboxConditionReady))
	if c == nil {
		return ""
	}
	return c.Message
}

var _ = Describe("Egress defaults", Label("unit"), func() {
	It("are the proxy's: a rule without ports allows 80 and 443 in the API and at the proxy", func() {
		var api []uint16
		for _, p := range sandboxv1alpha1.DefaultEgressPorts() {
			api = append(api, uint16(p))
		}
		Expect(api).To(Equal(egressproxy.DefaultPorts))
		Expect(sandboxv1alpha1.MaxEgressRules).To(BeNumerically("<=", egressproxy.MaxRules))
	})
})
