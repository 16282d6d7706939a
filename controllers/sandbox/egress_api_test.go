/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package sandbox

import (
	"context"
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sandboxv1alpha1 "github.com/code-sandbox/code-sandbox-operator/api/v1alpha1"
	"github.com/code-sandbox/code-sandbox-operator/internal/mcpserver/contract"
)

// The CRD's rules for spec.network.egress (CEL and schema), against
// envtest's kube-apiserver.
var _ = Describe("Egress policy validation", func() {
	ctx := context.Background()
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	egressSpec := func(rules ...any) map[string]any {
		return map[string]any{"image": "x", "nodeName": testNodePrefix + "nowhere",
			"network": map[string]any{"mode": "Egress", "egress": map[string]any{"allow": rules}}}
	}
	host := func(h string) map[string]any { return map[string]any{"host": h} }
	create := func(kind string, spec map[string]any) error {
		obj := map[string]any{
			"apiVersion": sandboxv1alpha1.GroupVersion.String(),
			"kind":       kind,
			"metadata":   map[string]any{"name": "e", "namespace": ns},
			"spec":       spec,
		}
		return k8sClient.Create(ctx, unstructuredFrom(obj), client.DryRunAll)
	}

	DescribeTable("refuses a bad host with a message naming the problem",
		func(h, want string) {
			err := create("Sandbox", egressSpec(host(h)))
			Expect(err).To(HaveOccurred(), h)
			Expect(err.Error()).To(ContainSubstring(want), h)
		},
		Entry("a bare *", "*", "host must be a DNS name"),
		Entry("a wildcard of a single label", "*.com", "host must be a DNS name"),
		Entry("a wildcard in the middle", "a.*.com", "host must be a DNS name"),
		Entry("a partial wildcard", "a*.example.com", "host must be a DNS name"),
		Entry("a double wildcard", "*.*.example.com", "host must be a DNS name"),
		Entry("an IPv4 literal", "169.254.169.254", "host must be a DNS name"),
		Entry("an IPv6 literal", "::1", "host must be a DNS name"),
		Entry("a bracketed IPv6 literal", "[::1]", "host must be a DNS name"),
		Entry("upper case", "API.example.com", "host must be lower case"),
		Entry("a trailing dot", "api.example.com.", "host must not end with a dot"),
		Entry("a single label", "localhost", "host must be a DNS name"),
		Entry("a port in the host", "example.com:443", "host must be a DNS name"),
		Entry("a scheme", "https://example.com", "host must be a DNS name"),
		Entry("a label starting with -", "-a.example.com", "host must be a DNS name"),
		Entry("a label of 64 characters", strings.Repeat("a", 64)+".example.com", "host must be a DNS name"),
		Entry("an underscore", "a_b.example.com", "host must be a DNS name"),
		Entry("an empty host", "", "spec.network.egress.allow[0].host"),
		Entry("too long", strings.Repeat("a.", 127)+"com", "spec.network.egress.allow[0].host"),
		Entry("a newline", "a.example.com\nb.org", "host must be a DNS name"),
	)

	DescribeTable("refuses a bad rule with a message naming the problem",
		func(spec map[string]any, want string) {
			err := create("Sandbox", spec)
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(want))
		},
		Entry("a policy without network mode Egress",
			map[string]any{"image": "x", "network": map[string]any{"egress": map[string]any{}}}, "network.egress needs network.mode Egress"),
		Entry("http rules without inject",
			egressSpec(map[string]any{"host": "a.example.com", "http": map[string]any{"methods": []any{"GET"}}}), "http rules need inject"),
		Entry("inject on a wildcard",
			egressSpec(map[string]any{"host": "*.example.com", "inject": map[string]any{"header": "Authorization", "secretRef": map[string]any{"name": "s", "key": "k"}}}),
			"inject needs an exact host"),
		Entry("inject of the Host header",
			egressSpec(map[string]any{"host": "a.example.com", "inject": map[string]any{"header": "HOST", "secretRef": map[string]any{"name": "s", "key": "k"}}}),
			"inject.header must not be a header that steers the connection"),
		Entry("a header name with a colon",
			egressSpec(map[string]any{"host": "a.example.com", "inject": map[string]any{"header": "X-A: b", "secretRef": map[string]any{"name": "s", "key": "k"}}}),
			"spec.network.egress.allow[0].inject.header"),
		Entry("a value prefix with a newline",
			egressSpec(map[string]any{"host": "a.example.com", "inject": map[string]any{"header": "Authorization", "valuePrefix": "Bearer\r\nX-Evil: 1", "secretRef": map[string]any{"name": "s", "key": "k"}}}),
			"spec.network.egress.allow[0].inject.valuePrefix"),
		Entry("a secret without a key",
			egressSpec(map[string]any{"host": "a.example.com", "inject": map[string]any{"header": "Authorization", "secretRef": map[string]any{"name": "s"}}}),
			"spec.network.egress.allow[0].inject.secretRef.key"),
		Entry("an unknown method",
			egressSpec(map[string]any{"host": "a.example.com", "http": map[string]any{"methods": []any{"CONNECT"}},
				"inject": map[string]any{"header": "Authorization", "secretRef": map[string]any{"name": "s", "key": "k"}}}),
			"spec.network.egress.allow[0].http.methods[0]"),
		Entry("a relative path prefix",
			egressSpec(map[string]any{"host": "a.example.com", "http": map[string]any{"pathPrefixes": []any{"v1/"}},
				"inject": map[string]any{"header": "Authorization", "secretRef": map[string]any{"name": "s", "key": "k"}}}),
			"spec.network.egress.allow[0].http.pathPrefixes[0]"),
		Entry("port 0", egressSpec(map[string]any{"host": "a.example.com", "ports": []any{0}}), "spec.network.egress.allow[0].ports[0]"),
		Entry("port 65536", egressSpec(map[string]any{"host": "a.example.com", "ports": []any{65536}}), "spec.network.egress.allow[0].ports[0]"),
		Entry("a host twice", egressSpec(host("a.example.com"), host("a.example.com")), "Duplicate value"),
		Entry("more than 64 rules", egressSpec(manyHosts(sandboxv1alpha1.MaxEgressRules+1)...), "must have at most 64 items"),
	)

	It("agrees with the MCP server's check of egress_allow on every host", func() {
		for _, h := range []string{"*", "*.com", "a.*.com", "a*.example.com", "*.*.example.com", "169.254.169.254", "::1", "[::1]",
			"API.example.com", "api.example.com.", "localhost", "example.com:443", "https://example.com", "-a.example.com",
			strings.Repeat("a", 64) + ".example.com", "a_b.example.com", "", strings.Repeat("a.", 127) + "com", "a.example.com\nb.org",
			"1.2.3", "a.b.c-", "xn--bcher-kva.example", "api.example.com", "*.example.com", "*.a.example.com", "a-b.example.co",
			strings.Repeat("a", 63) + ".example.com", "0.example.com", "example.c0m", "example.0com"} {
			celErr := create("Sandbox", egressSpec(host(h)))
			goErr := contract.ValidateEgressHost(h)
			Expect(celErr == nil).To(Equal(goErr == nil), "host %q: CEL says %v, the MCP server says %v", h, celErr, goErr)
		}
	})

	It("accepts the largest policy and a full rule", func() {
		Expect(create("Sandbox", egressSpec(manyHosts(sandboxv1alpha1.MaxEgressRules)...))).To(Succeed())
		Expect(create("Sandbox", egressSpec(
			map[string]any{"host": "api.example.com", "ports": []any{443, 8443},
				"http":   map[string]any{"methods": []any{"GET", "POST"}, "pathPrefixes": []any{"/v1/"}},
				"inject": map[string]any{"header": "Authorization", "valuePrefix": "Bearer ", "secretRef": map[string]any{"name": "api-token", "key": "token"}}},
			host("*.pythonhosted.org"), host("pypi.org"), host(strings.Repeat("a", 63)+".example.com"),
		))).To(Succeed())
		// An empty allow list is a policy too: it reaches nothing.
		Expect(create("Sandbox", egressSpec())).To(Succeed())
	})

	It("checks a warm pool template's policy with the same rules", func() {
		tmpl := func(h string) map[string]any {
			return map[string]any{"template": map[string]any{"image": "x",
				"network": map[string]any{"mode": "Egress", "egress": map[string]any{"allow": []any{host(h)}}}}}
		}
		Expect(create("SandboxWarmPool", tmpl("*.example.com"))).To(Succeed())
		err := create("SandboxWarmPool", tmpl("*.com"))
		Expect(err).To(MatchError(ContainSubstring("host must be a DNS name")))
	})

	It("lets the policy of an existing Sandbox change, but not appear, vanish or change the mode", func() {
		sbx := createSandbox(newSandbox(ns, "live", testNodePrefix+"nowhere", func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Network = sandboxv1alpha1.SandboxNetwork{Mode: sandboxv1alpha1.NetworkEgress,
				Egress: &sandboxv1alpha1.EgressPolicy{Allow: []sandboxv1alpha1.EgressRule{{Host: "a.example.com"}}}}
		}))
		key := client.ObjectKeyFromObject(sbx)
		s := getSandbox(key)
		s.Spec.Network.Egress.Allow = []sandboxv1alpha1.EgressRule{{Host: "b.example.com", Ports: []int32{8443}}}
		Expect(k8sClient.Update(ctx, s)).To(Succeed())
		Expect(getSandbox(key).Spec.Network.Egress.Allow[0].Host).To(Equal("b.example.com"))

		s = getSandbox(key)
		s.Spec.Network.Egress = nil
		Expect(k8sClient.Update(ctx, s)).To(MatchError(ContainSubstring("network.egress may be changed but not added or removed")))
		s = getSandbox(key)
		s.Spec.Network = sandboxv1alpha1.SandboxNetwork{Mode: sandboxv1alpha1.NetworkNone}
		err := k8sClient.Update(ctx, s)
		Expect(err).To(MatchError(ContainSubstring("network.mode is immutable")))

		plain := createSandbox(newSandbox(ns, "plain", testNodePrefix+"nowhere", func(s *sandboxv1alpha1.Sandbox) {
			s.Spec.Network.Mode = sandboxv1alpha1.NetworkEgress
		}))
		s = getSandbox(client.ObjectKeyFromObject(plain))
		s.Spec.Network.Egress = &sandboxv1alpha1.EgressPolicy{}
		Expect(k8sClient.Update(ctx, s)).To(MatchError(ContainSubstring("network.egress may be changed but not added or removed")))
	})

	DescribeTable("refuses bad SandboxQuota egress rules",
		func(spec map[string]any, want string) {
			err := create("SandboxQuota", spec)
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(want))
		},
		Entry("egress rules without allowEgress", map[string]any{"egress": map[string]any{"requirePolicy": true}}, "egress rules need allowEgress: true"),
		Entry("a wildcard of a single label", map[string]any{"allowEgress": true, "egress": map[string]any{"allowedHosts": []any{"*.com"}}}, "each allowed host must be"),
		Entry("a bare *", map[string]any{"allowEgress": true, "egress": map[string]any{"allowedHosts": []any{"*"}}}, "each allowed host must be"),
		Entry("an IP", map[string]any{"allowEgress": true, "egress": map[string]any{"allowedHosts": []any{"10.0.0.1"}}}, "each allowed host must be"),
		Entry("upper case", map[string]any{"allowEgress": true, "egress": map[string]any{"allowedHosts": []any{"Example.com"}}}, "each allowed host must be"),
	)

	It("accepts SandboxQuota egress rules", func() {
		Expect(create("SandboxQuota", map[string]any{"allowEgress": true,
			"egress": map[string]any{"requirePolicy": true, "allowedHosts": []any{"*.example.com", "pypi.org"}}})).To(Succeed())
	})
})

func manyHosts(n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = map[string]any{"host": fmt.Sprintf("h%d.%s.example.com", i, strings.Repeat("x", 60))}
	}
	return out
}
